"""The Python API: headedit.discover / validate / export / evaluate, silent, reporting typed events to `progress`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import headedit
from headedit.events import HeadScored, Log, StageFinished, StageProgress, StageStarted

ROOT = Path(__file__).resolve().parent.parent


def test_import_headedit_stays_free_of_torch_and_textual() -> None:
    code = ("import sys, headedit; fns = (headedit.discover, headedit.validate, headedit.export, headedit.evaluate); "
            "assert all(callable(f) for f in fns); "
            "bad = [m for m in ('torch', 'textual', 'transformers') if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_evaluate_reports_progress_and_prints_nothing(capsys) -> None:
    events: list = []
    result = headedit.evaluate("headedit:demo", "copy-second", heads="0.0,1.1", split="heldout", n=300,
                               progress=events.append)
    assert result["n"] == 300 and result["heads"] == "0.0,1.1" and 0.9 < result["accuracy"] <= 1.0
    assert [type(e) for e in events][:1] == [StageStarted] and isinstance(events[-1], StageFinished)
    progress = [e for e in events if isinstance(e, StageProgress)]
    assert [e.done for e in progress] == [256, 300] and all(e.total == 300 for e in progress)
    intact = headedit.evaluate("headedit:demo", "copy-second", split="heldout", n=300)
    assert intact["accuracy"] < 0.2  # the intact demo model copies the first token
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_evaluate_a_loaded_model_needs_its_tokenizer() -> None:
    from headedit.model.loading import load_model

    model, tokenizer, _ = load_model("headedit:demo")
    with pytest.raises(headedit.HeadeditError, match="tokenizer"):
        headedit.evaluate(model, "copy-second", n=10)
    assert headedit.evaluate(model, "copy-second", n=10, tokenizer=tokenizer)["n"] == 10


@pytest.mark.slow
def test_discover_validate_export_evaluate_on_the_demo(tmp_path: Path, capsys) -> None:
    """The README's Python API example, as written there."""
    events: list = []
    run = headedit.discover(ROOT / "recipes" / "demo.toml", tmp_path / "run", progress=events.append)
    result = headedit.validate(run, progress=events.append)
    out = headedit.export(run, tmp_path / "export", progress=events.append)
    check = headedit.evaluate("headedit:demo", "copy-second", heads=result["heads"], split="heldout",
                              progress=events.append)
    assert capsys.readouterr().out == ""  # the library never prints
    assert result["passed"] and result["heads"] and result["damage"]["kl_mean"] > 0
    assert (out / "README.md").is_file() and (out / "heads.png").is_file()
    # hooks on the intact model give the reloaded baked checkpoint's held-out accuracy, example for example
    assert check["n"] == result["n"] and check["accuracy"] == result["edited_acc"]
    stages = {e.stage for e in events if isinstance(e, StageStarted)}
    assert {"validate", "bake", "eval"} <= stages and any(s.startswith("screen") for s in stages)
    assert any(isinstance(e, HeadScored) for e in events) and any(isinstance(e, Log) for e in events)
    resumed: list = []
    assert headedit.discover(run_dir=run, resume=True, progress=resumed.append) == run  # finished: reused
    assert any(isinstance(e, Log) and "reusing" in e.message for e in resumed)
