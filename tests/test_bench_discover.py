"""`headedit bench discover`: three paths, same selection, ratios printed (no timing asserted)."""
from __future__ import annotations

import re

import testkit.coin  # noqa: F401  (registers coin-test)
import torch
from testkit.models import save_coin_model

torch.set_num_threads(1)


def test_bench_discover_three_paths_agree(tmp_path, capsys) -> None:
    from headedit.cli import main

    model = save_coin_model(tmp_path / "model", num_hidden_layers=2)
    rc = main(["bench", "discover", "--model", str(model), "--task", "coin-test", "--n", "32",
               "--candidates", "4", "--max-heads", "2"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert re.fullmatch(r"speedup: \d+(\.\d+)?x identical: yes", out[-1]), out[-1]
    body = "\n".join(out)
    for label in ("(a) naive reference loop", "(b) plain batched loop", "(c) fast path", "a/c:", "b/c:"):
        assert label in body
    selections = re.findall(r"selected (\S+)", body)
    assert len(selections) == 3 and len(set(selections)) == 1


def test_bench_screens_on_the_demo_agrees_with_the_single_screen(capsys) -> None:
    """On the demo model the harmful heads for copy-second are 0.0 and 0.2 (single screen): the compressed
    (8 knockouts of 2 heads, Lasso) and gradient screens must both rank them in their top 2."""
    from headedit.bench.discover import model_and_task
    from headedit.bench.screens import run_screens
    from headedit.cli import main

    model, tok, task, examples, _ = model_and_task("headedit:demo", "copy-second", 400)
    r = run_screens(model, tok, task, examples, k=2)
    assert set(r["single"]["top"]) == {"0.0", "0.2"}
    assert r["compressed"]["overlap_with_single"] == 1.0 and r["gradient"]["overlap_with_single"] == 1.0
    assert r["compressed"]["ablated_sets"] == r["knockout_sets"] == 8 and r["single"]["ablated_sets"] == 8
    assert r["gradient"]["ablated_sets"] == 0  # one forward+backward per batch, no ablated evaluation
    assert main(["bench", "screens", "--n", "64", "--k", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines[-3:]] == ["single", "compressed", "gradient"]
    assert all("overlap with single:" in line for line in lines[-3:])
    assert main(["bench", "screens", "--fraction", "1.5"]) == 2
