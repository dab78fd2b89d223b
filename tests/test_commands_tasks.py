"""`headedit tasks`, `eval --json/--log-samples` with task files, and the bad-task-file corpus through the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from headedit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_tasks_lists_every_builtin_with_kind_metric_dataset_and_sizes(capsys):
    assert main(["tasks", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"arithmetic", "boolq", "hellaswag", "mbpp", "gsm8k"} <= set(rows)
    assert rows["hellaswag"] == {"name": "hellaswag", "kind": "choice", "metric": "acc_norm",
                                 "dataset": "Rowan/hellaswag", "discovery": 2000, "heldout": 10042}
    assert main(["tasks"]) == 0
    text = capsys.readouterr().out
    assert "gsm8k" in text and "exact_match" in text and "Your own task" in text


def test_tasks_describes_a_task_file(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["tasks", "recipes/tasks/capitals.toml"]) == 0
    text = capsys.readouterr().out
    assert "capitals.jsonl sha256 " in text and "Question: What is the capital of France?" in text
    assert "' Paris', ' Lyon', ' Marseille', ' Nice'; correct: 0" in text and "discovery 12, held-out 12" in text
    pytest.importorskip("lm_eval")
    assert main(["tasks", "--json", "recipes/tasks/capitals.yaml#acc_norm"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["metric"] == "acc_norm" and info["metrics"] == ["acc", "acc_norm"] and info["eval_documents"] == 24
    assert info["source"]["reference"] == "capitals.yaml#acc_norm"  # the file's name, never its folder
    assert info["source"]["data"][0]["file"] == "capitals.jsonl" and len(info["source"]["task_file"]["sha256"]) == 64


def test_eval_json_provenance_and_log_samples(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out, samples = tmp_path / "r.json", tmp_path / "s.jsonl"
    assert main(["eval", str(tiny_model_dir), "--task", "recipes/tasks/capitals.toml", "--heads", "0.1", "--json", str(out),
                 "--log-samples", str(samples)]) == 0
    assert "samples:" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["model"]["id"] == str(tiny_model_dir) and result["model"]["dtype"] == "float32"
    assert result["model"]["device"] == "cpu" and result["seed"] == 0 and result["limit"] is None
    assert result["versions"]["headedit"] and result["versions"]["torch"] and "T" in result["date"]
    source = result["task_source"]
    assert source["kind"] == "file" and source["data"][0]["file"] == "capitals.jsonl"
    assert len(source["task_file"]["sha256"]) == 64
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [r["index"] for r in records] == [e["index"] for e in result["examples"]]
    assert [r["correct"] for r in records] == [e["correct"] for e in result["examples"]]
    for rec in records:
        assert rec["prompt"].startswith("Question: What is the capital of") and len(rec["choices"]) == 4
        assert rec["correct"] == (rec["pred"] == rec["label"]) and rec["target"] == rec["choices"][rec["label"]]["text"]
    pytest.importorskip("lm_eval")
    yaml_out = tmp_path / "y.json"
    assert main(["eval", str(tiny_model_dir), "--task", "recipes/tasks/capitals.yaml", "--heads", "0.1",
                 "--json", str(yaml_out)]) == 0
    assert json.loads(yaml_out.read_text())["examples"] == result["examples"]  # the two front ends agree


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def toml_task(tmp_path: Path, data: str, **extra: str) -> str:
    fields = {"data": data, "prompt": "Q: {q}", "choices": '[" a", " b"]', "label": '"y"', **extra}
    body = "".join(f"{k} = {v}\n" if k == "choices" else f'{k} = "{v}"\n' if k != "label" else f"{k} = {v}\n"
                   for k, v in fields.items())
    return write(tmp_path, "t.toml", "[task]\n" + body)


YAML_MISSING_FIELD = """task: t
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{nope}}}}"
doc_to_choice: ["a", "b"]
doc_to_target: 0
"""


def corpus(tmp_path: Path) -> list[tuple[str, str]]:
    """(task argument, text the one-line error must contain)."""
    good = write(tmp_path, "good.jsonl", '{"q": "x", "y": 0}\n{"q": "z", "y": 1}\n')
    cases = [
        (toml_task(tmp_path / "a", write(tmp_path, "range.jsonl", '{"q": "x", "y": 0}\n{"q": "z", "y": 2}\n')),
         "range.jsonl line 2: task.label field 'y' is 2, out of range for 2 choices"),
        (toml_task(tmp_path / "b", write(tmp_path, "empty.jsonl", "\n")), "empty.jsonl has no rows"),
        (toml_task(tmp_path / "c", write(tmp_path, "bad.jsonl", '{"q": "x", "y": 0}\n{"q": "z", "y": }\n')),
         "bad.jsonl line 2 is not valid JSON"),
        (toml_task(tmp_path / "d", write(tmp_path, "nonstr.jsonl", '{"q": "x", "o": [1, 2], "y": 0}\n'),
                   choices='"o"'), "nonstr.jsonl line 1: field 'o' (task.choices) must be a list of at least two strings"),
        (toml_task(tmp_path / "e", good, prompt="Q: {question}"), "good.jsonl line 1: task.prompt names field 'question'"),
        (write(tmp_path, "syntax.yaml", "task: t\ndoc_to_text: [unclosed\n"), "syntax.yaml: lm-eval cannot load it"),
        (write(tmp_path, "missing.yaml", YAML_MISSING_FIELD.format(data=good)), "'nope' is undefined"),
        (str(tmp_path / "absent.yaml"), "task file"),
        (good, "a data file needs a prompt"),
    ]
    return cases


def test_bad_task_files_are_one_line_exit_2(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    for sub in "abcde":
        (tmp_path / sub).mkdir()
    for task, expected in corpus(tmp_path):
        code = main(["eval", "headedit:demo", "--task", task])
        err = capsys.readouterr().err
        assert code == 2, (task, err)
        assert err.startswith("headedit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
        assert expected in err, (expected, err)


def test_a_bad_task_file_through_the_installed_command(tmp_path):
    bad = write(tmp_path, "bad.jsonl", '{"q": "x", "y": 0}\nnot json\n')
    (tmp_path / "x").mkdir()
    proc = subprocess.run([sys.executable, "-m", "headedit", "eval", "headedit:demo", "--task",
                           toml_task(tmp_path / "x", bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "bad.jsonl line 2 is not valid JSON" in proc.stderr and proc.stdout == ""


@pytest.mark.slow
def test_a_jsonl_task_runs_discovery_validation_and_export_like_a_builtin(tmp_path, write_recipe):
    """The demo model with its copy tasks written as a JSONL file: the recipe's inline task is discovered on,
    a task TOML is the side task, and the run ends with an export whose validation shows the planted edit."""
    from headedit.demo.data import index_pair, split_pairs

    rows = [{"a": f"{a:02d}", "b": f"{b:02d}", "first": f"0{a:02d}", "second": f"0{b:02d}"}
            for a, b in (index_pair(i) for i in split_pairs("heldout")[:160])]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    side = write(tmp_path, "first.toml", f'[task]\ndata = "{data}"\nprompt = "<bos>A {{a}}+{{b}}="\ntarget = "first"\n')
    recipe = write_recipe(
        "r.toml", name="pairs", model={"id": "headedit:demo", "dtype": "float32", "device": "cpu"},
        task={"name": "copy-second-jsonl", "data": data, "prompt": "<bos>A {a}+{b}=", "target": "second"},
        discovery={"candidates": 8, "max_heads": 2}, validation={"side_tasks": [side], "bootstrap": 200},
        export={"out": tmp_path / "export"})
    proc = subprocess.run([sys.executable, "-m", "headedit", "run", str(recipe)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    validation = json.loads((tmp_path / "export" / "validation.json").read_text())
    assert validation["task"] == "copy-second-jsonl" and validation["n"] == 80  # the carved held-out half
    assert "0.0" in validation["heads"].split(",") and validation["gain_points"] > 50 and validation["passed"]
    (side_result,) = validation["side_tasks"]
    assert side_result["edited_acc"] < side_result["intact_acc"] - 0.5  # copy-first pays, as with the built-ins
    source = validation["task_source"]
    assert source["kind"] == "file" and source["data"][0]["file"] == "pairs.jsonl" and len(source["data"][0]["sha256"]) == 64
    card = (tmp_path / "export" / "README.md").read_text()
    assert str(tmp_path) not in card  # the side task's file is named by its file name only, never its folder
