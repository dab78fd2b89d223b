"""The Hub token is used, never written: a full `headedit run --push` with HF_TOKEN set, then a byte scan.

The CLI runs with HOME, TMPDIR, HF_HOME and its working directory all inside one test folder, so every file
it could have written (run folder, export, caches, temp files, logs) is under that folder; each one, the
captured stdout/stderr, and every file of every commit on the local Hub are scanned for the token (raw and
in the encodings a careless writer might use).
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from testkit.recipes import recipe_toml

ROOT = Path(__file__).resolve().parent.parent



def recipe(repo: str) -> str:
    return recipe_toml("token-scan", model={"id": "headedit:demo", "dtype": "float32", "device": "cpu"},
                       task={"name": "copy-second", "discovery": 160, "heldout": 240, "seed": 0},
                       discovery={"screen": "single", "candidates": 4, "max_heads": 2},
                       validation={"side_tasks": ["copy-first"], "bootstrap": 1000},
                       export={"out": "exports/token-scan", "repo_id": repo, "private": True})


def needles(token: str) -> list[bytes]:
    raw = token.encode()
    return [raw, raw[::-1], base64.b64encode(raw), quote(token).encode(), raw.hex().encode(),
            token.encode("utf-16-le"), f"Bearer {token}".encode()]


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


@pytest.mark.slow
def test_full_run_with_push_writes_the_token_nowhere(tmp_path, hub_server, hub_user, hub_env):
    token = hub_user.token
    work, home, tmp = tmp_path / "work", tmp_path / "home", tmp_path / "tmp"
    for folder in (work, home, tmp):
        folder.mkdir()
    repo = f"{hub_user.name}/token-scan"
    (work / "recipe.toml").write_text(recipe(repo))
    env = {**hub_env, "HOME": str(home), "TMPDIR": str(tmp), "HF_HOME": str(home / "hf"), "HF_TOKEN": token,
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("XDG_CACHE_HOME", None)
    result = subprocess.run([sys.executable, "-m", "headedit", "run", "recipe.toml", "--out", "runs/scan", "--push"],
                            cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    # The run really happened end to end: validated, exported, pushed in one commit.
    run, export = work / "runs" / "scan", work / "exports" / "token-scan"
    validation = json.loads((run / "validation.json").read_text())
    assert validation["passed"] is True, validation["verdict"]
    assert (export / "headedit.json").is_file() and (export / "README.md").is_file()
    state = hub_server.state.repos[repo]
    head = state.resolve("main")
    assert "model.safetensors" in head.files and "README.md" in head.files
    assert hub_server.file_bytes(repo, "headedit.json") == (export / "headedit.json").read_bytes()

    # Scan: every file the process could have written, its output, and the pushed repo (every commit).
    scanned = files_under(tmp_path)
    assert len(scanned) > 20 and any(p.is_relative_to(run) for p in scanned) and any(p.is_relative_to(export) for p in scanned)
    found: list[str] = []
    for needle in needles(token):
        found += [str(p.relative_to(tmp_path)) for p in scanned if needle in p.read_bytes()]
        found += [f"stdout/stderr ({needle[:6]!r}...)" for text in (result.stdout, result.stderr) if needle in text.encode()]
        for commit in state.commits.values():
            found += [f"hub {repo}@{commit.sha[:8]}:{name}" for name in commit.files
                      if needle in hub_server.file_bytes(repo, name, commit.sha)]
    assert found == [], found
    # The read-only token and the user's name are not secrets, but the token's tail must not appear either
    # (e.g. a masked "hf_***abcd" that leaks the last characters).
    assert not [p for p in scanned if token[-8:].encode() in p.read_bytes()]
