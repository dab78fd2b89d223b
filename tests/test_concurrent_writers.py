"""One writer per output (issue 18, class 4): a second `bake --out o` or `export RUN --out e` fails with one clear
line while another is writing the same output, `--force` included, and what is left at the output is always one
writer's whole result. Also: outputs that can never be written (read-only places) are one line, not a traceback.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from testkit.files import tree_digest

from headedit.atomic import writer_lock
from headedit.errors import OutputExistsError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))


def cli(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "headedit", *args], env=env, cwd=cwd, text=True, capture_output=True,
                          timeout=240)


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture(scope="module")
def source_and_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from hub.builders import make_run, make_source

    root = tmp_path_factory.mktemp("writers")
    source = make_source(root / "source")
    run = make_run(root / "run", source)
    recipe = run / "recipe.toml"  # the card builders' recipe spells sizes the old way; export parses it
    recipe.write_text(recipe.read_text().replace("discovery_n", "discovery").replace("heldout_n", "heldout"))
    return source, run


def test_writer_lock_is_exclusive_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "o"
    with writer_lock(out):
        assert (tmp_path / ".o.lock").read_text() == str(os.getpid())
        with pytest.raises(OutputExistsError, match=f"another headedit process \\(pid {os.getpid()}\\) is writing"):
            with writer_lock(out):
                pass
    assert list(tmp_path.iterdir()) == []  # the lock file goes with its writer
    (tmp_path / ".o.lock").write_text("12345")  # a killed writer's file: no flock holds it
    with writer_lock(out):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_second_writer_is_refused_while_one_writes_force_included(source_and_run, tmp_path: Path) -> None:
    """Deterministic: this process holds the output's writer lock while the CLI tries to write it."""
    source, run = source_and_run
    bake_out, export_out = tmp_path / "baked", tmp_path / "exported"
    with writer_lock(bake_out), writer_lock(export_out):
        attempts = [
            ["bake", str(source), "--heads", "0.1", "--out", str(bake_out), "--force"],
            ["export", str(run), "--out", str(export_out), "--force"],
        ]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(cli, attempts))
        for res in results:
            line = one_line(res)
            assert f"another headedit process (pid {os.getpid()}) is writing" in line, line
        assert sorted(p.name for p in tmp_path.iterdir()) == [".baked.lock", ".exported.lock"]  # ours, nothing else
    assert list(tmp_path.iterdir()) == []


def test_concurrent_bakes_and_exports_leave_one_whole_result(source_and_run, tmp_path: Path) -> None:
    """Real races: several bakes and exports of one output at once: exactly one wins, the others fail with one
    line (another is writing, or it already exists), and the output is the winner's whole result."""
    from headedit.export.bake import bake, verify_export

    source, run = source_and_run
    reference = tree_digest(bake(source, "0.1", tmp_path / "reference"))
    races = {  # --force against a writer is checked deterministically above; here the races without it
        "bake": [["bake", str(source), "--heads", "0.1", "--out", str(tmp_path / "o")]] * 3,
        "export": [["export", str(run), "--out", str(tmp_path / "e")]] * 2,
    }
    with ThreadPoolExecutor(5) as pool:
        results = {name: list(pool.map(cli, argvs)) for name, argvs in races.items()}
    for name, runs in results.items():
        wins = [r for r in runs if r.returncode == 0]
        for res in runs:
            if res.returncode != 0:
                line = one_line(res)
                assert "is writing" in line or "already exists" in line, line
        assert len(wins) == 1, (name, [r.stderr for r in runs])
    assert tree_digest(tmp_path / "o") == reference
    verify_export(tmp_path / "e")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "o", "reference"]  # no temp or lock left


def _mount_read_only(folder: Path) -> bool:
    folder.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def test_read_only_targets_are_one_line(source_and_run, tmp_path: Path) -> None:
    """As root (CI) file modes do not stop a write; a read-only mount does."""
    source, run = source_and_run
    ro = tmp_path / "ro"
    if not _mount_read_only(ro):
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        for args in (["bake", str(source), "--heads", "0.1", "--out", str(ro / "deep" / "out")],
                     ["validate", str(run), "--json", str(ro / "v.json")]):
            line = one_line(cli(args))
            assert "write" in line and str(ro) in line, line
        assert list(ro.iterdir()) == []
    finally:
        subprocess.run(["umount", str(ro)], check=False)
