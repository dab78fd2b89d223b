"""discover / validate / run on a real tiny model folder, through the library and the real CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from testkit import coin  # registers the coin-test task
from testkit.journal import evaluations, journal_rows, journal_work
from testkit.kill import kill_when
from testkit.recipes import coin_recipe

from headedit import pipeline  # noqa: E402
from headedit.errors import RunError  # noqa: E402
from headedit.journal import Journal  # noqa: E402
from headedit.model.heads import parse_heads  # noqa: E402
from headedit.recipe import parse_recipe  # noqa: E402
from headedit.runs import run_lock  # noqa: E402

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, coin_model) -> Path:
    """One uninterrupted discover run, shared by the read-only checks."""
    root = tmp_path_factory.mktemp("run")
    recipe = parse_recipe(coin_recipe(coin_model), root / "r.toml")
    return pipeline.discover(recipe, root / "run")


def test_run_folder_contents(finished: Path) -> None:
    info = json.loads((finished / "run.json").read_text())
    assert info["format"] == 1 and info["name"] == "tiny-coin"
    assert set(info["model"]["sha256"]) == {"model.safetensors"}
    assert info["environment"]["torch"] == torch.__version__.split("+")[0] or info["environment"]["torch"]
    assert info["task"]["discovery_n"] == 192
    assert (finished / "recipe.toml").read_text().startswith('name = "tiny-coin"')
    screen = json.loads((finished / "screen.json").read_text())
    assert screen["method"] == "single" and len(screen["delta"]) == 3 and len(screen["delta"][0]) == 4
    assert "sign test" in screen["rule"]
    search = json.loads((finished / "search.json").read_text())
    selection = json.loads((finished / "selection.json").read_text())
    assert "even if zero or negative" in search["rule"]
    assert search["trace"] and all({"heads", "size", "acc", "gain"} <= set(t) for t in search["trace"])
    best = max(search["trace"], key=lambda t: t["acc"])
    assert selection["discovery_acc"] == pytest.approx(max(best["acc"], selection["intact_acc"]))
    # the journal holds every set of the screen and the search, with per-example bits, discovery split only
    with Journal(finished / "journal.sqlite") as j:
        assert j.splits_used() == {"discovery"}
        keys = {e.heads for e in j.entries()}
        assert {t["heads"] for t in search["trace"]} <= keys
        assert "" in keys and all(len(parse_heads(k)) <= 3 for k in keys)
        sel = j.get("discovery", selection["heads"])
        assert sel.n == 192 and sel.bits.mean() == pytest.approx(selection["discovery_acc"])


def test_kill_9_mid_screen_then_resume_redoes_nothing(tmp_path, coin_model, finished) -> None:
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(coin_recipe(coin_model))
    run_dir = tmp_path / "run"
    code = coin.CLI_CODE
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", code, "discover", str(recipe_file), "--out", str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed = kill_when(proc, lambda: evaluations(run_dir, "heads != '' AND n < 192") >= 4, timeout=120)
    proc.wait(timeout=30)
    assert killed, "discover finished before it could be killed mid-screen"
    assert not (run_dir / "screen.json").exists()  # killed mid-screen
    before = journal_rows(run_dir)
    assert before  # some finished work survived the kill

    resumed = subprocess.run([sys.executable, "-c", code, "discover", "--resume", str(run_dir)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    expected = json.loads((finished / "selection.json").read_text())["heads"]
    assert resumed.stdout.strip().splitlines()[-1] == f"selected: {expected}"
    after = journal_rows(run_dir)
    assert after == journal_rows(finished)  # same evaluations, same bits
    assert all(after[k][0] >= v[0] for k, v in before.items())
    assert journal_work(run_dir) == journal_work(finished)  # no (set, example) evaluated twice across the kill
    assert json.loads((run_dir / "selection.json").read_text()) == json.loads((finished / "selection.json").read_text())


def test_lock_newer_format_and_corrupt_journal(tmp_path, finished) -> None:
    with run_lock(finished):
        with pytest.raises(RunError, match="in use by another headedit process"):
            pipeline.discover(None, finished, resume=True)
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "recipe.toml").write_text((finished / "recipe.toml").read_text())
    (newer / "run.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(RunError, match="newer than this headedit"):
        pipeline.discover(None, newer, resume=True)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for name in ("recipe.toml", "run.json"):
        (corrupt / name).write_text((finished / name).read_text())
    (corrupt / "journal.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(RunError, match="corrupt"):
        pipeline.discover(None, corrupt, resume=True)
    with pytest.raises(RunError, match="does not exist"):
        pipeline.discover(None, tmp_path / "nope", resume=True)
    with pytest.raises(RunError, match="already exists"):
        pipeline.discover(parse_recipe((finished / "recipe.toml").read_text()), finished)


def test_resume_of_finished_run_evaluates_nothing(finished) -> None:
    work = journal_work(finished)
    pipeline.discover(None, finished, resume=True)
    assert journal_work(finished) == work


def test_evaluate_set_is_journaled(finished) -> None:
    acc = pipeline.evaluate_set(finished, "0.0,2.3")
    with Journal(finished / "journal.sqlite") as j:
        entry = j.get("discovery", "0.0,2.3")
        assert entry.stage == "manual" and entry.bits.mean() == pytest.approx(acc)
    work = journal_work(finished)
    assert pipeline.evaluate_set(finished, "2.3,0.0") == acc  # same set, canonical key: free
    assert journal_work(finished) == work
    pipeline.release()


def test_validate_uses_baked_checkpoint_and_heldout_only_here(tmp_path, coin_model) -> None:
    from headedit.engine.core import Engine
    from headedit.model.loading import load_model
    from headedit.tasks import get_task

    recipe = parse_recipe(coin_recipe(coin_model, side='"arithmetic"', heldout=96), tmp_path / "r.toml")
    path = pipeline.discover(recipe, tmp_path / "run")
    with Journal(path / "journal.sqlite") as j:
        assert j.splits_used() == {"discovery"}
    result = pipeline.validate(path)
    saved = json.loads((path / "validation.json").read_text())
    assert saved == json.loads(json.dumps(result))
    heads = saved["heads"]
    assert heads == json.loads((path / "selection.json").read_text())["heads"] and heads
    assert not list(path.glob(".validate-*"))  # temporary export cleaned up
    with Journal(path / "journal.sqlite") as j:
        assert j.splits_used() == {"discovery", "heldout", "heldout:arithmetic"}
        assert {e.stage for e in j.entries() if e.split.startswith("heldout")} == {"validate:intact", "validate:baked"}
        intact, edited = j.get("heldout", "").bits, j.get("heldout", heads).bits
    # the baked checkpoint's answers equal the in-memory ablation's on every held-out example
    model, tok, layout = load_model(coin_model)
    engine = Engine(model, tok, layout, batch_size=32)
    task = get_task("coin-test")
    examples = list(task.load("heldout", 96, 0).examples)
    hooks = engine.correctness(task, examples, [(), parse_heads(heads)])
    assert np.array_equal(hooks[0], intact) and np.array_equal(hooks[1], edited)
    # reported numbers follow from the journaled bits
    assert saved["n"] == 96
    assert saved["intact_acc"] == pytest.approx(intact.mean())
    assert saved["edited_acc"] == pytest.approx(edited.mean())
    assert saved["gain_points"] == pytest.approx(100 * (edited.mean() - intact.mean()))
    lo, hi = saved["ci95_points"]
    assert lo <= saved["gain_points"] <= hi
    assert saved["passed"] == (lo > 0 and saved["gain_points"] > 0 and saved["mcnemar_p"] < 0.05)
    assert saved["verdict"].startswith("gain held" if saved["passed"] else "gain did not hold")
    side = saved["side_tasks"]
    assert [s["task"] for s in side] == ["arithmetic"] and side[0]["n"] == 96


def test_cli_run_end_to_end_and_validate_json(tmp_path, coin_model, capsys) -> None:
    from headedit.cli import main

    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(coin_recipe(coin_model, screen="compressed", discovery=96, heldout=64,
                                         extra="compressed_sets = 24\ncompressed_fraction = 0.2"))
    run_dir, export = tmp_path / "run", tmp_path / "export"
    assert main(["run", str(recipe_file), "--out", str(run_dir), "--export", str(export)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    selection = json.loads((run_dir / "selection.json").read_text())
    assert out[-1] == f"selected: {selection['heads']}"
    screen = json.loads((run_dir / "screen.json").read_text())
    assert screen["method"] == "compressed" and screen["evaluations"] <= 24 and "Lasso" in screen["rule"]
    validated = json.loads((run_dir / "validation.json").read_text())
    if selection["heads"] and validated["passed"]:
        assert (export / "model.safetensors").is_file() and (export / "validation.json").is_file()
    elif selection["heads"]:  # noise on 64 held-out rows: the gain did not hold, so nothing is exported unforced
        assert not export.exists() and any("validation did not pass" in line for line in out)
    json_out = tmp_path / "v.json"
    assert main(["validate", str(run_dir), "--json", str(json_out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(json_out.read_text())
    assert data["verdict"] in printed.replace("\n", " ") or data["verdict"].split(":")[0] in printed
    assert main(["discover", "--resume", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"selected: {selection['heads']}"
    assert main(["discover"]) == 2
    assert "needs a recipe" in capsys.readouterr().err
