"""Run folders are checked, never trusted (issue 18, class 5): the recipe is pinned, every journal row and run file
is shape-checked when read, and nothing in the run is written before everything read has been checked.

Library-level and fast (no model): the CLI paths over the same defects are corpus cases (`resume-*`, `validate-*`,
`export-*` in tests/test_bad_input_corpus.py).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from testkit.files import tree_digest
from testkit.recipes import recipe_toml

from headedit.errors import RunError
from headedit.journal import Journal
from headedit.runs import Run

RECIPE = recipe_toml("trust", task={"name": "copy-second", "discovery": 16, "heldout": 16, "seed": 0})


def sessions(run: Path) -> int:
    db = sqlite3.connect(f"file:{run / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])
    finally:
        db.close()


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """A run with a journal (opened once, so it pins the recipe), a screen, a selection and a validation."""
    created = Run.create(tmp_path / "run", RECIPE, {"name": "trust", "task": {"name": "copy-second"}})
    with created.journal() as journal:
        rng = np.random.default_rng(0)
        for heads in ("", "0.1", "0.1,1.2"):
            journal.put("discovery", heads, rng.random(16) > 0.5, "screen", 16)
    created.write("screen.json", {"method": "single", "rule": "r", "num_layers": 2, "num_heads": 4, "intact_acc": 0.5,
                                  "delta": [[0.0] * 4, [1.0] * 4], "evaluations": 9})
    created.write("selection.json", {"heads": "0.1,1.2", "discovery_acc": 0.6, "intact_acc": 0.5, "gain_points": 10.0})
    created.write("validation.json", {"heads": "0.1,1.2", "passed": True, "n": 16})
    return created


def test_recipe_is_pinned_in_run_json_and_the_journal(run: Run) -> None:
    info = json.loads(run.file("run.json").read_text())
    assert info["recipe_sha256"] == hashlib.sha256(RECIPE.encode()).hexdigest()
    Run.open(run.path).recipe()  # unchanged: opens

    changed = RECIPE.replace("seed = 0", "seed = 7")
    run.file("recipe.toml").write_text(changed)
    before = tree_digest(run.path)
    with pytest.raises(RunError, match="recipe.toml of run .* was changed after the run was created") as err:
        Run.open(run.path)
    assert "start a new run" in str(err.value) and "\n" not in str(err.value)

    # run.json edited to agree: the journal, written under the old recipe, still refuses, and writes nothing
    run.file("run.json").write_text(json.dumps({**info, "recipe_sha256": hashlib.sha256(changed.encode()).hexdigest()}))
    before, count = tree_digest(run.path), sessions(run.path)
    reopened = Run.open(run.path)
    with pytest.raises(RunError, match="written under another recipe"):
        reopened.journal()
    assert tree_digest(run.path) == before and sessions(run.path) == count


def test_a_run_without_a_pin_is_pinned_by_its_journal(tmp_path: Path) -> None:
    """Runs from before the pin (no recipe_sha256 in run.json) are pinned at their next journal open."""
    made = Run.create(tmp_path / "old", RECIPE, {"name": "trust"})
    info = json.loads(made.file("run.json").read_text())
    del info["recipe_sha256"]
    made.file("run.json").write_text(json.dumps(info))
    with Run.open(made.path).journal():
        pass
    made.file("recipe.toml").write_text(RECIPE.replace("seed = 0", "seed = 3"))
    with pytest.raises(RunError, match="written under another recipe"):
        Run.open(made.path).journal()


@pytest.mark.parametrize(("sql", "expect"), [
    ("UPDATE evaluations SET correct_bits = x'01' WHERE heads = '0.1'", "1 bytes of correctness bits for n = 16"),
    ("UPDATE evaluations SET correct_bits = x'010203' WHERE heads = '0.1'", "3 bytes of correctness bits"),
    ("UPDATE evaluations SET n = -4 WHERE heads = '0.1'", "not a count"),
    ("UPDATE evaluations SET n = 'many' WHERE heads = '0.1'", "not a count"),
    ("UPDATE evaluations SET heads = '0.1,0.1' WHERE heads = '0.1'", "not a canonical head set"),
    ("UPDATE evaluations SET heads = '0.0-99999999999' WHERE heads = '0.1'", "not a canonical head set"),
    ("UPDATE evaluations SET heads = 7 WHERE heads = '0.1'", "heads that are not"),  # TEXT affinity: '7'
    ("UPDATE evaluations SET heads = x'00' WHERE heads = '0.1'", "heads that are not text"),
    ("UPDATE evaluations SET split = x'00' WHERE heads = '0.1'", "not text"),
    ("UPDATE evaluations SET objective_values = x'0000' WHERE heads = '0.1'", "2 bytes of objective values for n = 16"),
    ("UPDATE meta SET value = 'abc' WHERE key = 'format'", "has format 'abc'"),
    ("UPDATE meta SET value = '99999999999999999999' WHERE key = 'format'", "not a format number"),
])
def test_journal_rows_are_checked_before_anything_is_written(run: Run, sql: str, expect: str) -> None:
    db = sqlite3.connect(run.file("journal.sqlite"))
    try:
        with db:
            db.execute(sql)
    finally:
        db.close()
    before, count = tree_digest(run.path), sessions(run.path)
    with pytest.raises(RunError, match=expect) as err:
        Journal(run.file("journal.sqlite"))
    assert "\n" not in str(err.value)
    assert tree_digest(run.path) == before and sessions(run.path) == count  # not even a session row


@pytest.mark.parametrize(("name", "content", "expect"), [
    ("selection.json", [1], "is a JSON list, not an object"),
    ("selection.json", {"heads": "1.2,0.1"}, "not in canonical form"),
    ("selection.json", {"heads": "0.1", "gain_points": "ten"}, "not a number"),
    ("screen.json", [1, 2], "is a JSON list"),
    ("screen.json", {"method": "single", "rule": "r", "num_layers": 2, "num_heads": 4, "intact_acc": 0.5,
                     "delta": [[0.0] * 4], "evaluations": 9}, "one list of numbers per layer"),
    ("screen.json", {"method": "single", "rule": "r", "num_layers": -1, "num_heads": 4, "intact_acc": 0.5,
                     "delta": [], "evaluations": 9}, "not a count"),
    ("search.json", {"trace": "none"}, "trace that is not a list"),
    ("validation.json", {"heads": "0.1,1.2", "passed": "yes"}, "passed: true/false"),
    ("run.json", {"format": 1, "task": "copy-second"}, "task of type str"),
    ("run.json", {"format": "1"}, "no format number"),
    ("run.json", {"format": 1, "model": [1]}, "model of type list"),
])
def test_run_files_of_the_wrong_shape_are_refused_at_open(run: Run, name: str, content: object, expect: str) -> None:
    if name == "run.json":
        content = {**json.loads(run.file("run.json").read_text()), **content} if isinstance(content, dict) else content
    run.file(name).write_text(json.dumps(content))
    before = tree_digest(run.path)
    with pytest.raises(RunError, match=expect) as err:
        Run.open(run.path)
    assert "\n" not in str(err.value) and name in str(err.value)
    assert tree_digest(run.path) == before


def test_unknown_task_in_run_json_and_non_regular_run_files(run: Run, tmp_path: Path) -> None:
    import os

    info = json.loads(run.file("run.json").read_text())
    run.file("run.json").write_text(json.dumps({**info, "task": {"name": "no-such-task"}}))
    with pytest.raises(RunError, match="run.json names task 'no-such-task'"):
        Run.open(run.path).recipe()
    run.file("run.json").write_text(json.dumps(info))

    run.file("selection.json").unlink()
    os.mkfifo(run.file("selection.json"))  # read without a type check first, this would block forever
    opened = Run.open(run.path)
    with pytest.raises(RunError, match="not a regular file"):
        opened.read("selection.json")
    with pytest.raises(RunError, match="has no selection yet"):
        opened.selection()
