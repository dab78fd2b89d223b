"""`run` and `export` refuse unusable outputs before any model is loaded, naming their own options; a late
failure keeps the validated run and says how to finish it; exports are readable by others (umask modes)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from testkit.recipes import recipe_toml

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "recipes" / "demo.toml")


def _cli(args: list[str], cwd: Path, umask: int | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "headedit", *args], cwd=cwd, text=True, capture_output=True,
                          timeout=300, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    return proc, time.monotonic() - started


def test_run_refuses_an_existing_export_before_discovery(tmp_path: Path) -> None:
    (tmp_path / "exports" / "demo").mkdir(parents=True)
    proc, took = _cli(["run", DEMO, "--export", "exports/demo"], tmp_path)
    assert proc.returncode == 2 and took < 8.0, (proc.stderr, took)  # seconds, not a discovery (~60 s)
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "exports/demo already exists" in err
    assert "--force" in err and "--export DIR" in err and "--out" not in err
    assert not (tmp_path / "runs").exists() and "loading model" not in proc.stdout  # nothing ran, nothing written


def test_run_refuses_the_default_export_folder_and_a_used_run_folder(tmp_path: Path) -> None:
    (tmp_path / "exports" / "demo").mkdir(parents=True)  # the recipe's export.out
    proc, _ = _cli(["run", DEMO], tmp_path)
    assert proc.returncode == 2 and "--export DIR" in proc.stderr and not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "run.json").write_text("{}")
    proc, _ = _cli(["run", DEMO, "--out", "runs/r1", "--export", "elsewhere"], tmp_path)
    assert proc.returncode == 2 and "run folder runs/r1 already exists" in proc.stderr
    assert "--out RUN" in proc.stderr and "headedit discover --resume runs/r1" in proc.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_run_refuses_an_unwritable_export_place(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        proc, _ = _cli(["run", DEMO, "--export", "locked/out"], tmp_path)
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 2 and "not writable" in proc.stderr and "--export DIR" in proc.stderr


def test_export_refuses_an_existing_out_before_baking(tmp_path: Path) -> None:
    from hub.builders import make_run, make_source

    source = make_source(tmp_path / "source")
    run = make_run(tmp_path / "run", source)
    (run / "recipe.toml").write_text(recipe_toml("tiny", model=source,
                                                 task={"name": "copy-second", "discovery": 64, "heldout": 128}))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    proc, _ = _cli(["export", str(run), "--out", "taken"], tmp_path)
    assert proc.returncode == 2 and "taken already exists" in proc.stderr
    assert "--force" in proc.stderr and "--out DIR" in proc.stderr and "--export" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["keep.txt"]
    assert not list(tmp_path.glob(".taken*"))  # no temp folder: nothing was baked
    proc, _ = _cli(["export", str(run), "--out", "taken", "--force"], tmp_path)  # --force never eats a non-export
    assert proc.returncode == 2 and "not an earlier export" in proc.stderr and "--out DIR" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["keep.txt"]


def _modes(folder: Path) -> set[tuple[str, int]]:
    return {(p.name if p != folder else ".", stat.S_IMODE(p.stat().st_mode)) for p in [folder, *folder.rglob("*")]}


def test_exports_get_umask_modes_not_private_ones(tmp_path: Path) -> None:
    proc, _ = _cli(["bake", "headedit:demo", "--heads", "0.0", "--out", "open"], tmp_path, umask=0o022)
    assert proc.returncode == 0, proc.stderr
    modes = _modes(tmp_path / "open")
    assert (".", 0o755) in modes and ("model.safetensors", 0o644) in modes and ("headedit.json", 0o644) in modes
    assert {m for name, m in modes if name != "."} == {0o644}
    proc, _ = _cli(["bake", "headedit:demo", "--heads", "0.0", "--out", "group"], tmp_path, umask=0o027)
    assert proc.returncode == 0, proc.stderr
    modes = _modes(tmp_path / "group")
    assert (".", 0o750) in modes and {m for name, m in modes if name != "."} == {0o640}


@pytest.mark.slow
def test_a_late_export_failure_keeps_the_run_and_names_the_finishing_command(tmp_path: Path, monkeypatch,
                                                                             capsys) -> None:
    from headedit.cli import main

    monkeypatch.chdir(tmp_path)
    run_dir, target = tmp_path / "runs" / "late", tmp_path / "out"

    def occupy_target() -> None:  # someone creates the export folder while the run validates
        deadline = time.monotonic() + 600
        while not (run_dir / "selection.json").is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        target.mkdir()
        (target / "theirs.txt").write_text("not an export")

    helper = threading.Thread(target=occupy_target, daemon=True)
    helper.start()
    assert main(["run", DEMO, "--out", str(run_dir), "--export", str(target)]) == 2
    helper.join(5)
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and (run_dir / "validation.json").is_file()
    assert f"the validated run {run_dir} is kept" in err and f"`headedit export {run_dir} --out {target}`" in err
    assert main(["export", str(run_dir), "--out", str(tmp_path / "finished")]) == 0  # the named command finishes it
    assert (tmp_path / "finished" / "README.md").is_file() and (tmp_path / "finished" / "model.safetensors").is_file()
