"""The remove direction (`discovery.direction = "remove"`): find the heads a capability needs, zero them, and
show the removal is real and selective (retain tasks within tolerance), or say plainly that it is not.

Logic tests use a synthetic per-example evaluator; the rest run the bundled demo models end to end through the
pipeline and the CLI (real forwards, real run folders, real exports), on the shipped recipes with smaller splits.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from headedit.discovery.direction import RemovalScorer, RetainConstraint  # noqa: E402
from headedit.discovery.scorer import Scorer  # noqa: E402
from headedit.discovery.search import SearchSpec, joint_search  # noqa: E402
from headedit.discovery.single import single_screen  # noqa: E402
from headedit.errors import RecipeError  # noqa: E402
from headedit.journal import Journal  # noqa: E402
from headedit.model.heads import Head, HeadLayout  # noqa: E402
from headedit.recipe import parse_recipe  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "import sys; from headedit.cli import main; sys.exit(main())"]
LAYOUT = HeadLayout.from_config({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
                                 "hidden_size": 32})


def small(recipe: str, discovery: int, heldout: int, extra: str = "") -> str:
    """A shipped recipe's text with smaller splits (and extra [discovery] lines), so tests stay fast."""
    text = (ROOT / "recipes" / recipe).read_text()
    text = text.replace("discovery = 1000\n", f"discovery = {discovery}\n").replace("heldout = 2000\n",
                                                                                   f"heldout = {heldout}\n")
    return text.replace("[discovery]\n", f"[discovery]\n{extra}", 1)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}


# ---- recipe ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lines, field, words", [
    ('direction = "sideways"', "discovery.direction", "improve|remove"),
    ('retain = ["copy-first"]', "discovery.retain", 'applies only to direction = "remove"'),
    ('retain_tolerance = 5.0', "discovery.retain_tolerance", 'applies only to direction = "remove"'),
    ('direction = "remove"\nretain = []', "discovery.retain", "needs a task to retain"),
    ('direction = "remove"\nretain = ["copy-second"]', "discovery.retain", "names the task being removed"),
    ('direction = "remove"\nretain = ["no-such-task"]', "discovery.retain[0", "unknown task"),
    ('direction = "remove"\nretain_tolerance = 101', "discovery.retain_tolerance", "points in 0..100"),
    ('direction = "remove"\nretain = ["copy-first", "copy-first"]', "discovery.retain", "twice"),
])
def test_recipe_direction_fields_are_checked_with_the_field_named(lines, field, words):
    text = (ROOT / "recipes" / "demo.toml").read_text().replace("[discovery]\n", f"[discovery]\n{lines}\n", 1)
    with pytest.raises(RecipeError) as err:
        parse_recipe(text)
    assert err.value.field == field and words in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_retain_defaults_to_side_tasks_and_improve_recipes_round_trip():
    removal = parse_recipe((ROOT / "recipes" / "demo.toml").read_text().replace(
        "[discovery]\n", '[discovery]\ndirection = "remove"\n', 1))  # copy-second removed, side task copy-first
    from headedit.tui.form import dumps_toml  # the TUI writes recipes back from their fields

    from headedit.discovery.direction import retain_names

    assert retain_names(removal) == ("copy-first",)
    for name in ("demo.toml", "demo-remove.toml", "addsub-remove.toml", "smollm2-135m-remove.toml"):
        recipe = parse_recipe((ROOT / "recipes" / name).read_text())
        again = parse_recipe(dumps_toml(recipe.to_dict()))
        assert again.discovery == recipe.discovery, name


# ---- the search on the negated objective, with a retain constraint ------------------------------------
class Planted:
    """Per-example margins of two tasks sharing heads: zeroing a head adds its planted effect (plus paired
    noise fixed by the seed) to every example's margin; an example is right when its margin is positive."""

    def __init__(self, n: int, base: float, effects: dict[tuple[int, int], float], seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.base = base + rng.normal(0.0, 0.5, n)
        self.effect = {h: effects.get((h.layer, h.head), 0.0) + rng.normal(0.0, 0.05, n) for h in LAYOUT.all_heads()}

    def __call__(self, sets: list, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        values = np.array([self.base[start:stop] + sum((self.effect[h][start:stop] for h in s), np.zeros(stop - start))
                           for s in sets])  # [sets, stop - start]
        return values > 0, values.astype(np.float32)


def test_removal_search_maximises_the_drop_and_skips_heads_a_retain_task_needs(tmp_path):
    # target needs 0.1 (strongly) and 1.2; retain also needs 0.1 but not 1.2 or 0.3
    target = Planted(400, 2.0, {(0, 1): -4.0, (1, 2): -3.0, (0, 3): -1.0}, seed=1)
    retain = Planted(400, 2.0, {(0, 1): -4.0}, seed=2)
    with Journal(tmp_path / "j.sqlite") as journal:
        plain = Scorer(journal, "discovery", 400, target, objective="margin")
        scorer = RemovalScorer(plain)
        constraint = RetainConstraint({"keep": Scorer(journal, "discovery:retain:keep", 400,
                                                      lambda s, a, b: retain(s, a, b)[0])}, tolerance=2.0)
        screen = single_screen(scorer, LAYOUT)
        assert screen.top(3)[0] == Head(0, 1)  # the screen ranks by the target's drop
        result = joint_search(scorer, screen.top(4), LAYOUT.all_heads(), SearchSpec(max_heads=3), constraint=constraint)
        assert Head(0, 1) not in result.selected and Head(1, 2) in result.selected
        assert plain.accuracy(result.selected) < 0.2 < 0.9 < plain.accuracy(())  # the real accuracy fell
        checked = constraint.to_json()["checked"]
        assert {"heads": "0.1", "admitted": False} == {k: checked[0][k] for k in ("heads", "admitted")}
        assert all(c["admitted"] for c in checked if c["heads"] == "1.2")
        # the journal keeps the real bits and values; the view only negates them
        assert np.array_equal(journal.get("discovery", "1.2").bits, ~scorer.bits((Head(1, 2),)))


def test_a_search_whose_every_set_breaks_the_retain_task_finds_nothing(tmp_path):
    both = {(0, 1): -4.0, (1, 2): -3.0}
    target, retain = Planted(300, 2.0, both, seed=3), Planted(300, 2.0, both, seed=4)
    with Journal(tmp_path / "j.sqlite") as journal:
        scorer = RemovalScorer(Scorer(journal, "discovery", 300, target, objective="margin"))
        constraint = RetainConstraint({"keep": Scorer(journal, "r", 300, lambda s, a, b: retain(s, a, b)[0])}, 1.0)
        result = joint_search(scorer, [Head(0, 1), Head(1, 2)], [Head(0, 1), Head(1, 2)],
                              SearchSpec(max_heads=2, beam=1), constraint=constraint)
    assert not result.found and "no size-1 set keeps every retain task within 1 points" in result.reason


# ---- the bundled demo, end to end ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_removed(tmp_path_factory):
    """`headedit run` on recipes/demo-remove.toml (discovery 400, held-out 1,000): run folder, export, stdout."""
    root = tmp_path_factory.mktemp("demo-remove")
    (root / "r.toml").write_text(small("demo-remove.toml", 400, 1000))
    res = subprocess.run([*CLI, "run", str(root / "r.toml"), "--out", str(root / "run"), "--export",
                          str(root / "export")], capture_output=True, text=True, env=env(), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return root, res.stdout


def test_demo_removal_of_copy_first_holds_and_copy_second_is_retained(demo_removed):
    root, out = demo_removed
    v = json.loads((root / "run" / "validation.json").read_text())
    assert v["direction"] == "remove" and v["task"] == "copy-first" and v["passed"] is True, v["verdict"]
    assert v["gain_points"] <= -50 and v["ci95_points"][1] < 0 and v["mcnemar_p"] < 0.05
    (retained,) = [r for r in v["side_tasks"] if r["task"] == "copy-second"]
    assert retained["retain"] and retained["within_tolerance"] and retained["ci95_points"][0] >= -2.0
    assert v["selectivity"]["target_drop_points"] == pytest.approx(-v["gain_points"])
    assert v["relative_error_reduction"] is None
    sel = json.loads((root / "run" / "selection.json").read_text())
    assert sel["direction"] == "remove" and sel["found"] and sel["discovery_acc"] < sel["intact_acc"]
    assert sel["retain"][0]["task"] == "copy-second" and sel["retain"][0]["within_tolerance"]
    screen = json.loads((root / "run" / "screen.json").read_text())
    assert screen["direction"] == "remove" and screen["unit"].startswith("drop in")
    for head in sel["heads"].split(","):  # every selected head lowers copy-first when zeroed alone
        layer, h = map(int, head.split("."))
        assert screen["delta"][layer][h] > 0
    # the CLI says which direction it ran and how the retain task moved; the export's card says it plainly
    assert "direction: remove copy-first" in out and "retained copy-second" in out and "retain: copy-second" in out
    assert "selectivity: copy-first fell" in out and out.strip().splitlines()[-1] == f"selected: {sel['heads']}"
    card = (root / "export" / "README.md").read_text()
    assert "## Capability removed" in card and "removes a capability" in card and "ablated to remove copy-first" in card
    assert "| copy-second |" in card and "capability-removal" in card and "Do not treat this as a safety guarantee" in card


def test_a_retain_task_beyond_tolerance_fails_and_export_refuses_without_force(demo_removed, tmp_path):
    """Constructed: a hand-picked set (0.1, which copy-second also needs) replaces the search's choice."""
    from headedit.pipeline import release, select, validate
    from headedit.pipeline.export import run_export_blocked

    root, _ = demo_removed
    run = tmp_path / "run"
    shutil.copytree(root / "run", run)
    select(run, "0.1")
    release()
    v = validate(run)
    (retained,) = [r for r in v["side_tasks"] if r["task"] == "copy-second"]
    assert v["gain_points"] < 0 and v["ci95_points"][1] < 0  # copy-first did fall...
    assert retained["ci95_points"][0] < -2.0 and not retained["within_tolerance"]  # ...but copy-second too
    assert v["passed"] is False and v["verdict"].startswith("removal not selective")
    assert run_export_blocked(v, force=False) is not None
    refused = subprocess.run([*CLI, "export", str(run), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                             env=env(), timeout=600)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "removal not selective" in lines[0], refused.stderr
    assert "--force" in lines[0] and not (tmp_path / "out").exists()
    forced = subprocess.run([*CLI, "export", str(run), "--out", str(tmp_path / "out"), "--force"], capture_output=True,
                            text=True, env=env(), timeout=600)
    assert forced.returncode == 0, forced.stderr[-2000:]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "**Validation did not pass**" in card and "| copy-second |" in card and "| **no** |" in card


# ---- the add/sub model: remove addition, retain subtraction -----------------------------------------
def test_addsub_removal_of_addition_retaining_subtraction_is_reported_as_measured(tmp_path):
    from headedit import pipeline

    recipe = parse_recipe(small("addsub-remove.toml", 400, 1000), tmp_path / "r.toml")
    run = pipeline.discover(recipe, tmp_path / "run")
    v = pipeline.validate(run)
    (sub,) = [r for r in v["side_tasks"] if r["task"] == "sub-demo"]
    dropped = v["gain_points"] < 0 and v["ci95_points"][1] < 0 and v["mcnemar_p"] < 0.05
    assert v["passed"] is (dropped and sub["ci95_points"][0] >= -2.0)  # the verdict is exactly its rule
    # measured on the committed checkpoint (README): zeroing 0.1 removes addition and subtraction improves
    assert v["heads"] == "0.1" and v["passed"] and v["gain_points"] < -90 and sub["gain_points"] > 20
    search = json.loads((run / "search.json").read_text())
    refused = [c for c in search["retain"]["checked"] if not c["admitted"]]
    assert refused and all(min(c["ci_points"]["sub-demo"]) < -2.0 for c in refused)  # heads subtraction needs


# ---- kill -9 mid-discovery in the remove direction -------------------------------------------------------
@pytest.mark.slow
def test_kill_9_during_removal_discovery_resumes_to_the_same_selection(tmp_path):
    import torch
    from testkit.journal import journal_rows, journal_totals, journal_work
    from testkit.kill import run_and_kill

    from headedit import pipeline

    text = small("demo-remove.toml", 256, 200)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI runs (OMP_NUM_THREADS=1), so the bits are comparable
    try:
        reference = pipeline.discover(parse_recipe(text, tmp_path / "r.toml"), tmp_path / "reference")
    finally:
        torch.set_num_threads(threads)
    ref_rows, (ref_work, _) = journal_rows(reference), journal_totals(reference)
    ref_selection = json.loads((reference / "selection.json").read_text())
    assert any(split.startswith("discovery:retain:") for split, _ in ref_rows)  # the retain checks are journaled

    recipe_file, run = tmp_path / "r.toml", tmp_path / "run"
    recipe_file.write_text(text)
    kills = 0
    for fraction in (0.25, 0.6, 0.9):  # of the uninterrupted run's journaled work: screen, search, retain checks
        args = ["discover", "--resume", str(run)] if (run / "run.json").is_file() else \
            ["discover", str(recipe_file), "--out", str(run)]
        res = run_and_kill([*CLI, *args], env(), lambda _t, f=fraction: journal_work(run) >= f * ref_work, 0.05)
        if not res.killed:
            assert res.returncode == 0, res.stderr[-2000:]
            break
        kills += 1
        for key, (n, bits) in journal_rows(run).items():  # every row a prefix of the uninterrupted run's
            assert key in ref_rows and n <= ref_rows[key][0]
            assert np.array_equal(np.frombuffer(bits, bool), np.frombuffer(ref_rows[key][1], bool)[:n]), key
    final = run_and_kill([*CLI, "discover", "--resume", str(run)], env(), None)
    assert final.returncode == 0, final.stderr[-2000:]
    assert final.stdout.strip().splitlines()[-1] == f"selected: {ref_selection['heads']}"
    assert json.loads((run / "selection.json").read_text()) == ref_selection
    assert journal_rows(run) == ref_rows
    assert kills >= 2
