"""Run folders and the SQLite journal: round trips, prefixes, format checks, the lock across processes."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from headedit.errors import RunError
from headedit.journal import Journal
from headedit.runs import Run, default_run_dir, environment, run_lock, weight_hashes

REPO = Path(__file__).resolve().parents[1]


def test_journal_round_trip_and_prefix_extension(tmp_path) -> None:
    bits = np.random.default_rng(0).random(37) < 0.5  # odd length: packbits padding must not leak
    with Journal(tmp_path / "j.sqlite") as j:
        j.put("discovery", "0.1", bits[:16], "screen:single", new_examples=16)
        j.put("discovery", "0.1", bits, "screen:single", new_examples=21)
        j.put("discovery", "", bits, "screen:single", new_examples=37)
        j.put("discovery", "0.1", bits[:10], "search", new_examples=0)  # shorter: ignored
        with pytest.raises(RunError, match="not deterministic"):
            j.put("discovery", "0.1", np.concatenate([~bits, bits]), "search", new_examples=37)
    with Journal(tmp_path / "j.sqlite") as j:
        entry = j.get("discovery", "0.1")
        assert entry.n == 37 and np.array_equal(entry.bits, bits) and entry.stage == "screen:single"
        assert j.get("heldout", "0.1") is None
        assert j.splits_used() == {"discovery"}
        sessions = j.sessions()
        assert sessions[0]["examples_evaluated"] == 16 + 21 + 37 and sessions[0]["sets_evaluated"] == 3
        assert len(sessions) == 2  # every open is a session


def test_journal_newer_format_and_garbage(tmp_path) -> None:
    path = tmp_path / "j.sqlite"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '7' WHERE key = 'format'")
    with pytest.raises(RunError, match="newer"):
        Journal(path)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"\x00garbage" * 512)
    with pytest.raises(RunError, match="corrupt"):
        Journal(bad)


def test_run_create_open_and_checks(tmp_path) -> None:
    run = Run.create(tmp_path / "r", 'name = "x"\n', {"name": "x"})
    assert run.recipe_text == 'name = "x"\n'
    assert Run.open(tmp_path / "r").info["format"] == 1
    run.write("notes.json", {"a": 1})  # a file without a schema; stage files are shape-checked (test_run_trust)
    assert run.read("notes.json") == {"a": 1}
    (tmp_path / "r" / "notes.json").write_text("{broken")
    with pytest.raises(RunError, match="corrupt"):
        run.read("notes.json")
    (tmp_path / "r" / "run.json").write_text(json.dumps({"format": 2}))
    with pytest.raises(RunError, match="newer"):
        Run.open(tmp_path / "r")
    with pytest.raises(RunError, match="not a headedit run"):
        Run.open(tmp_path)
    with pytest.raises(RunError, match="already exists"):
        Run.create(tmp_path / "r", "", {})
    assert default_run_dir("a b", tmp_path).name.startswith("a-b-")
    env = environment("cpu")
    assert env["device"] == "cpu" and "torch" in env and "python" in env
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"abc")
    assert weight_hashes(tmp_path / "m") == {
        "model.safetensors": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}


def test_lock_refuses_second_process_and_dies_with_holder(tmp_path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from headedit.runs import run_lock\n"
         f"with run_lock({str(tmp_path)!r}):\n    print('locked', flush=True); time.sleep(60)"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunError, match=f"pid {holder.pid}"):
            with run_lock(tmp_path):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    time.sleep(0.05)
    with run_lock(tmp_path):  # kill -9 released it: no stale lock
        pass


def test_run_creation_is_all_or_nothing(tmp_path) -> None:
    """A process killed while creating a run leaves no half run folder behind at the target."""
    target = tmp_path / "runs" / "r1"
    code = (
        "import os, sys, headedit.runs as r\n"
        "r.write_json = lambda path, obj: os._exit(9)  # die after the recipe, before run.json\n"
        f"r.Run.create(__import__('pathlib').Path({str(target)!r}), 'name = \"x\"', {{}})\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 9, res.stderr
    assert not target.exists()  # only a hidden .r1.creating-* sibling may remain
    run = Run.create(target, 'name = "x"\n', {"name": "x"})
    assert (target / "run.json").is_file() and (target / "recipe.toml").read_text() == 'name = "x"\n'
    assert Run.open(target).info["name"] == "x"
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.startswith(".")) == ["r1"]
    with pytest.raises(RunError):
        Run.create(target, 'name = "y"\n', {})
    assert run.path == target and (target / "recipe.toml").read_text() == 'name = "x"\n'
