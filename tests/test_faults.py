"""kill -9 at seeded random moments during discover, bake and push; then the same command again.

Each scenario compares against an uninterrupted run of the same command:
- discover: every kill is followed by `discover --resume RUN`; the journal never holds a wrong, duplicated or lost
  evaluation (its rows are prefixes of the uninterrupted run's, its work counter equals the rows it holds), and
  the final journal and selection equal the uninterrupted run's.
- bake: a poller watches the target folder the whole time: it is absent or a complete export (verify_export
  passes, bytes equal to the uninterrupted bake); never half-written.
- push: after each kill the local Hub holds either the commit (every file, every byte) or no new commit.
- two processes on one run folder: the second refuses with one clear line (the lock); the first is unharmed.

Kill moments come from `random.Random(SEED)` (override with HEADEDIT_FAULT_SEED) and are spread over the
runs' progress: journal work for discover, elapsed time and the temp-folder phase for bake, the requests the
Hub has answered for push.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from testkit import coin  # registers coin-test in this process
from testkit.files import tree_digest
from testkit.journal import journal_rows, journal_totals, journal_work
from testkit.kill import base_env, run_and_kill
from testkit.recipes import coin_recipe

ROOT = Path(__file__).resolve().parent.parent
SEED = int(os.environ.get("HEADEDIT_FAULT_SEED", "9091"))
WRAPPER = coin.CLI_CODE
DISCOVERY_N = 256


def rng_for(name: str) -> random.Random:
    return random.Random(f"{SEED}:{name}")


# ---- discover ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_kill_9_during_discover_resumes_to_the_same_result(tmp_path, coin_model):
    import torch

    from headedit import pipeline
    from headedit.recipe import parse_recipe

    text = coin_recipe(coin_model, discovery=DISCOVERY_N, name="faults")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI runs (OMP_NUM_THREADS=1), so the bits are comparable
    try:
        reference = pipeline.discover(parse_recipe(text, tmp_path / "r.toml"), tmp_path / "reference")
    finally:
        torch.set_num_threads(threads)  # later tests in this process keep their own setting
    ref_rows = journal_rows(reference)
    ref_work, _ = journal_totals(reference)
    ref_selection = json.loads((reference / "selection.json").read_text())

    recipe_file, run = tmp_path / "r.toml", tmp_path / "run"
    recipe_file.write_text(text)
    rng = rng_for("discover")
    # Kill moments: fractions of the uninterrupted run's work, plus a short random delay so the kill lands
    # inside an evaluation, a journal commit or a results write rather than right after a commit.
    targets = sorted(rng.uniform(0.02, 0.95) * ref_work for _ in range(11))
    env = base_env()
    kills = 0
    log: list[str] = []
    for i, target in enumerate(targets):
        delay = rng.uniform(0.0, 0.25)
        args = ["discover", "--resume", str(run)] if (run / "run.json").is_file() else \
            ["discover", str(recipe_file), "--out", str(run)]
        res = run_and_kill([sys.executable, "-c", WRAPPER, *args], env,
                           lambda _t, target=target: journal_work(run) >= target, delay)
        log.append(f"#{i} target={target:.0f} delay={delay:.3f}s killed={res.killed} work={journal_work(run)}")
        if not res.killed:
            assert res.returncode == 0, (log, res.stderr[-2000:])
            break
        kills += 1
        work, held = journal_totals(run)
        assert work == held, f"journal work {work} != examples held {held}: an evaluation was counted twice ({log})"
        for key, (n, bits) in journal_rows(run).items():  # every row is a prefix of the uninterrupted run's
            assert key in ref_rows, (key, log)
            ref_n, ref_bits = ref_rows[key]
            assert n <= ref_n, (key, log)
            import numpy as np

            assert np.array_equal(np.frombuffer(bits, bool), np.frombuffer(ref_bits, bool)[:n]), (key, log)

    final = run_and_kill([sys.executable, "-c", WRAPPER, "discover", "--resume", str(run)], env, None)
    assert final.returncode == 0, (log, final.stderr[-2000:])
    assert final.stdout.strip().splitlines()[-1] == f"selected: {ref_selection['heads']}"
    assert json.loads((run / "selection.json").read_text()) == ref_selection
    assert journal_rows(run) == ref_rows  # nothing lost, nothing extra, same bits
    work, held = journal_totals(run)
    assert work == held == ref_work, (work, held, ref_work, log)  # no (set, example) evaluated twice
    for name in ("screen.json", "search.json"):
        ours, theirs = json.loads((run / name).read_text()), json.loads((reference / name).read_text())
        assert {k: v for k, v in ours.items() if k != "evaluations"} == \
            {k: v for k, v in theirs.items() if k != "evaluations"}, name
    print(f"seed {SEED}:", *log, sep="\n  ")
    assert kills >= 9, log


@pytest.mark.slow
def test_second_process_on_a_run_folder_is_refused(tmp_path, coin_model):
    """Freeze a discover that holds the run's lock (SIGSTOP), start a second one, then let the first finish."""
    recipe_file, run = tmp_path / "r.toml", tmp_path / "run"
    recipe_file.write_text(coin_recipe(coin_model, discovery=64, name="locked"))
    env = base_env()
    first = subprocess.Popen([sys.executable, "-c", WRAPPER, "discover", str(recipe_file), "--out", str(run)],
                             env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run / "lock").is_file() and (run / "lock").read_text().strip() == str(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
            time.sleep(0.005)
        first.send_signal(signal.SIGSTOP)
        before = tree_digest(run)
        # discover takes the lock; validate refuses a run whose discovery has not finished (or takes the lock)
        for args, expect in ((["discover", "--resume", str(run)], f"in use by another headedit process (pid {first.pid})"),
                             (["validate", str(run)], "")):
            second = subprocess.run([sys.executable, "-c", WRAPPER, *args], env=env, cwd=ROOT, capture_output=True,
                                    text=True, timeout=240)
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 2 and len(lines) == 1, second.stderr
            assert lines[0].startswith("headedit: error: ") and expect in lines[0], lines
        assert tree_digest(run) == before  # the refused processes wrote nothing
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=240)
    assert first.returncode == 0, err
    assert out.strip().splitlines()[-1].startswith("selected: ")
    assert journal_totals(run)[0] == journal_totals(run)[1]


# ---- bake --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharded_model(tmp_path_factory) -> Path:
    """The tiny model re-saved in several shards, so the bake's write phase lasts a while."""
    from headedit.bench.tiny import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("faults-sharded") / "model"
    tiny_model(seed=1, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, hidden_size=256,
               intermediate_size=1024).save_pretrained(folder, max_shard_size="1MB")  # 16 MB in 16 shards
    tiny_tokenizer().save_pretrained(folder)
    assert len(list(folder.glob("*.safetensors"))) >= 8
    return folder


class ExportWatcher:
    """Checks, whenever asked, that `target` is absent or a complete export equal to the reference."""

    def __init__(self, target: Path, reference: dict[str, str]) -> None:
        self.target, self.reference = target, reference
        self.seen_complete = 0
        self.problems: list[str] = []

    def __call__(self) -> None:
        from headedit.errors import ExportError
        from headedit.export.bake import verify_export

        try:
            inode = os.stat(self.target).st_ino
        except FileNotFoundError:
            return
        try:
            verify_export(self.target)
            digest = tree_digest(self.target)
        except (ExportError, OSError) as err:
            if self._same(inode):  # the folder was not swapped while we read it: it really is partial
                self.problems.append(f"partial export visible at the target: {err}")
            return
        if not self._same(inode):
            return
        if digest != self.reference:
            self.problems.append("export at the target differs from the uninterrupted bake")
        self.seen_complete += 1

    def _same(self, inode: int) -> bool:
        try:
            return os.stat(self.target).st_ino == inode
        except FileNotFoundError:
            return False


@pytest.mark.slow
def test_kill_9_during_bake_never_shows_a_partial_export(tmp_path, sharded_model):
    from headedit.export.bake import verify_export

    source_before = tree_digest(sharded_model)
    heads = "0.1,1.2,3.3"
    env = base_env()

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "headedit", "bake", str(sharded_model), "--heads", heads, "--out", str(out),
                "--force"]

    reference = tmp_path / "reference"
    first = run_and_kill(cmd(reference), env, None)
    assert first.returncode == 0, first.stderr
    ref_digest = tree_digest(reference)
    duration = first.seconds

    target = tmp_path / "out" / "edited"
    target.parent.mkdir()
    shutil.copytree(reference, target)  # an earlier export is there: every --force bake replaces it
    watcher = ExportWatcher(target, ref_digest)
    rng = rng_for("bake")
    kills, log = 0, []
    for i in range(14):
        if kills == 7:
            break
        if i % 2 == 0:  # a moment anywhere in the command's life (start-up, loading, writing, renaming)
            delay = rng.uniform(0.1, 1.0) * duration
            trigger: Callable[[float], bool] = lambda _t: True
        else:  # a moment inside the write phase: after the hidden temp folder appears
            delay = rng.uniform(0.0, 0.05)  # the shards take ~50 ms to write here
            trigger = lambda _t: target.parent.is_dir() and any(
                p.name.startswith(f".{target.name}.tmp-") for p in target.parent.iterdir())
        res = run_and_kill(cmd(target), env, trigger, delay, watch=watcher)
        leftovers = [p.name for p in target.parent.iterdir() if p.name != target.name] if target.parent.exists() else []
        log.append(f"#{i} delay={delay:.3f}s killed={res.killed} exists={target.exists()} temp folders={len(leftovers)}")
        kills += res.killed
        if not res.killed:
            assert res.returncode == 0, (log, res.stderr[-2000:])
        assert not watcher.problems, (watcher.problems, log)
        assert all(name.startswith(".") for name in leftovers), leftovers  # only hidden temp folders, never a name

    final = run_and_kill(cmd(target), env, None, watch=watcher)
    assert final.returncode == 0, final.stderr
    verify_export(target)
    assert tree_digest(target) == ref_digest
    # the temp folders of the killed bakes were cleaned up by the run that completed
    assert [p.name for p in target.parent.iterdir()] == [target.name], log
    assert not watcher.problems, watcher.problems
    assert tree_digest(sharded_model) == source_before
    print(f"seed {SEED}:", *log, sep="\n  ")
    assert kills == 7, log


# ---- push --------------------------------------------------------------------------------------
def hub_files(hub_server, repo_id: str, sha: str) -> dict[str, bytes]:
    commit = hub_server.state.repos[repo_id].commits[sha]
    return {name: hub_server.file_bytes(repo_id, name, sha) for name in commit.files if name != ".gitattributes"}


@pytest.mark.slow
def test_kill_9_during_push_leaves_the_commit_or_nothing(tmp_path, hub_server, hub_user, hub_env, hub_export):
    """Each round publishes a new revision of the export (its card changes), kills the push at a seeded moment,
    checks the Hub, then runs the same command again, which must land exactly that revision."""
    from headedit.export.bake import write_manifest
    from headedit.export.card import retarget
    from headedit.export.hub import upload_paths

    _, _, export = hub_export
    env = base_env(hub_env)
    card = (export / "README.md").read_text()

    def new_revision(i: int) -> dict[str, bytes]:
        (export / "README.md").write_text(card + f"\nrevision {i}\n")
        manifest = json.loads((export / "headedit.json").read_text())
        manifest = write_manifest(export, {k: v for k, v in manifest.items() if k != "files"})
        files = {name: (export / name).read_bytes() for name in upload_paths(export, manifest)}
        files["README.md"], files["headedit.json"] = retarget(files["README.md"], manifest, repo)  # names the repo
        return files

    def cmd(repo: str) -> list[str]:
        return [sys.executable, "-m", "headedit", "push", str(export), "--repo", repo]

    ref_repo = f"{hub_user.name}/reference"
    start = len(hub_server.state.requests)
    res = run_and_kill(cmd(ref_repo), env, None)
    assert res.returncode == 0, res.stderr
    ref_requests = len(hub_server.state.requests) - start
    assert ref_requests >= 4

    repo = f"{hub_user.name}/killed"
    revisions: list[dict[str, bytes]] = []

    def commits() -> dict[str, int]:
        """{sha: revision index} of every commit with files; each must be one whole revision, byte for byte."""
        state = hub_server.state.repos.get(repo)
        found = {}
        for sha, commit in (state.commits.items() if state else ()):
            if set(commit.files) - {".gitattributes"}:
                files = hub_files(hub_server, repo, sha)
                assert files in revisions, f"commit {sha} is not a whole revision (a partial push)"
                found[sha] = revisions.index(files)
        return found

    rng = rng_for("push")
    kills, log = 0, []
    for i in range(14):
        if kills == 5:
            break
        revisions.append(new_revision(i))
        nth = rng.randrange(0, ref_requests - 1)  # kill after the Hub has answered this many of our requests
        delay = rng.uniform(0.0, 0.05)
        before = commits()
        mark = len(hub_server.state.requests)
        res = run_and_kill(cmd(repo), env, lambda _t, mark=mark, nth=nth: len(hub_server.state.requests) - mark >= nth, delay)
        after = commits()
        new = set(after) - set(before)
        log.append(f"#{i} after {nth} requests + {delay:.3f}s: killed={res.killed} new commits={len(new)}")
        kills += res.killed
        if not res.killed:
            assert res.returncode == 0, (log, res.stderr[-2000:])
        assert len(new) <= 1 and all(after[sha] == i for sha in new), log  # this revision's commit, or nothing
        if after:
            assert hub_server.state.repos[repo].resolve("main").sha in after, log  # main is a whole commit
        again = run_and_kill(cmd(repo), env, None)  # the same command again
        assert again.returncode == 0, (log, again.stderr[-2000:])
        head = hub_server.state.repos[repo].resolve("main")
        assert hub_files(hub_server, repo, head.sha) == revisions[i], log
        assert len(set(commits()) - set(before)) == 1, log  # exactly one commit for this revision, never two
        assert hub_user.token not in res.stdout + res.stderr + again.stdout + again.stderr

    assert hub_files(hub_server, ref_repo, hub_server.state.repos[ref_repo].resolve("main").sha) != revisions[-1]
    print(f"seed {SEED}:", *log, sep="\n  ")
    assert kills == 5, log


# ---- validate (issue 18): a full disk is said so, a killed validation leaves no model copy behind ------------
@pytest.fixture(scope="module")
def discovered_run(tmp_path_factory, coin_model) -> Path:
    """A run whose discovery finished with heads selected (so validation bakes a temporary checkpoint)."""
    import torch

    from headedit import pipeline
    from headedit.recipe import parse_recipe

    root = tmp_path_factory.mktemp("validate-faults")
    text = coin_recipe(coin_model, discovery=64, heldout=64, name="validate-faults")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = pipeline.discover(parse_recipe(text, root / "r.toml"), root / "run")
    finally:
        torch.set_num_threads(threads)
    assert json.loads((run / "selection.json").read_text())["heads"], "the fixture needs a selection"
    return run


def _mount(path: Path, size: str) -> bool:
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_full_disk_during_validate_says_disk_full_and_the_run_resumes(tmp_path, discovered_run):
    disk = tmp_path / "disk"
    if not _mount(disk, "32m"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        run = Path(shutil.copytree(discovered_run, disk / "run"))
        filler = disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:  # fill the disk to the last byte
            for block in (2**20, 4096, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * block)
                except OSError:
                    pass
        finally:
            os.close(fd)
        env = base_env()
        res = subprocess.run([sys.executable, "-c", WRAPPER, "validate", str(run)], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=240)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert "disk full" in lines[0] and "corrupt" not in lines[0], lines
        assert not list(run.glob(".validate-*"))
        filler.unlink()
        again = subprocess.run([sys.executable, "-c", WRAPPER, "validate", str(run)], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=240)
        assert again.returncode == 0, again.stderr[-2000:]  # the journal was never corrupt
        assert json.loads((run / "validation.json").read_text())["heads"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.slow
def test_kill_9_during_validate_leaves_no_model_copy_after_the_next_run(tmp_path, discovered_run):
    """Killed while its temporary bake exists, validation leaves RUN/.validate-*; the next validation of the run
    removes it (it holds the run's lock, so any such folder is stale) and finishes."""
    run = Path(shutil.copytree(discovered_run, tmp_path / "run"))
    env = base_env()
    rng = rng_for("validate")
    kills, log = 0, []
    for i in range(5):
        if kills == 1:
            break
        # On the tiny demo model the whole edited arm can finish within milliseconds of the bake, so the kill
        # comes at once; a kill that lands after validation already removed its folder does not count.
        delay = rng.uniform(0.0, 0.005)
        res = run_and_kill([sys.executable, "-c", WRAPPER, "validate", str(run)], env,
                           lambda _t: any(run.glob(".validate-*/model")), delay)
        left = sorted(p.name for p in run.glob(".validate-*"))
        log.append(f"#{i} delay={delay:.3f}s killed={res.killed} temp={left}")
        if res.killed and left:
            kills += 1  # what a kill leaves: the full model copy ...
        elif not res.killed:
            assert res.returncode == 0 and not left, (log, res.stderr[-2000:])
    assert kills == 1, log
    final = run_and_kill([sys.executable, "-c", WRAPPER, "validate", str(run)], env, None)
    assert final.returncode == 0, final.stderr[-2000:]
    assert not list(run.glob(".validate-*")), log  # ... is gone after the next validation
    assert kills >= 1, log
    print(f"seed {SEED}:", *log, sep="\n  ")
