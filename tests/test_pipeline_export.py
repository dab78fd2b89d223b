"""`headedit export` of a run whose held-out validation failed: refused without --force (one line, nothing written),
and a forced export's card says first that validation did not pass. `headedit run` stops before exporting it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from testkit.kill import base_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory) -> tuple[Path, dict]:
    """The demo recipe (smaller splits) with the hand-picked set 0.1, which hurts copy-second: a validated run
    whose gain did not hold."""
    from headedit import pipeline
    from headedit.recipe import parse_recipe

    text = (ROOT / "recipes" / "demo.toml").read_text()
    text = text.replace("discovery = 1000", "discovery = 200").replace("heldout = 2000", "heldout = 300")
    run = pipeline.discover(parse_recipe(text), run_dir=tmp_path_factory.mktemp("failed") / "run")
    pipeline.select(run, "0.1")
    pipeline.release()
    return run, pipeline.validate(run)


def test_a_failed_validation_is_not_exported_without_force(failed_run, tmp_path):
    from headedit.pipeline.export import run_export_blocked

    run, v = failed_run
    assert v["heads"] == "0.1" and v["passed"] is False and v["gain_points"] < 0
    assert run_export_blocked(v, force=False) is not None and run_export_blocked(v, force=True) is None
    cli = [sys.executable, "-m", "headedit", "export", str(run), "--out", str(tmp_path / "out")]
    refused = subprocess.run(cli, capture_output=True, text=True, env=base_env(), cwd=tmp_path, timeout=300)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "did not hold" in lines[0] and "--force" in lines[0] and "Traceback" not in refused.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))

    forced = subprocess.run([*cli, "--force"], capture_output=True, text=True, env=base_env(), cwd=tmp_path, timeout=300)
    assert forced.returncode == 0, forced.stderr[-2000:]
    card = (tmp_path / "out" / "README.md").read_text()
    body = card.split("\n---\n", 1)[1]  # after the YAML metadata
    summary = next(line for line in body.splitlines() if line.startswith("This checkpoint") or line.startswith("**"))
    assert summary.startswith("**Validation did not pass** (gain did not hold"), summary
    assert "export --force" in summary
