"""`headedit eval` and `headedit bench eval` end to end on a tiny model saved as safetensors."""
from __future__ import annotations

import json

from headedit.cli import main


def test_eval_prints_accuracy_and_writes_json(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["eval", str(tiny_model_dir), "--task", "arithmetic", "--split", "heldout", "--limit", "6",
                 "--heads", "1.2,0.0", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "n=6" in printed and "95% CI" in printed
    data = json.loads(out.read_text())
    assert data["n"] == 6 and data["heads"] == "0.0,1.2" and [e["index"] for e in data["examples"]] == list(range(6))
    assert data["accuracy"] == sum(e["correct"] for e in data["examples"]) / 6
    assert 0 <= data["ci95"][0] <= data["accuracy"] <= data["ci95"][1] <= 1


def test_eval_bad_input_is_one_line(tiny_model_dir, capsys):
    assert main(["eval", str(tiny_model_dir), "--task", "nope"]) == 2
    assert main(["eval", str(tiny_model_dir), "--task", "arithmetic", "--heads", "7.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("headedit: error:") for line in err)


def test_bench_eval_reports_speedup_flops_and_a_second_dtype(capsys):
    assert main(["bench", "eval", "--task", "boolq", "--n", "4", "--sets", "2", "--compare-dtype", "bfloat16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    speed = next(line for line in lines if line.startswith("speedup: "))
    assert speed.endswith("x identical: yes")
    flops = next(line for line in lines if line.startswith("engine: "))
    assert "GFLOP/s executed" in flops and "plain float32 matmul" in flops
    other = next(line for line in lines if line.startswith("bfloat16: engine"))
    assert "results differ on" in other and "of 8 (set, example) pairs" in other
