"""Discovery over several processes (torchrun, gloo on CPU): same journal and selection as one process,
and a run started with 2 processes, killed, resumes with 1."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import testkit.coin  # noqa: F401  (registers the coin-test task)
import torch
from testkit.journal import evaluations, journal_rows, journal_work
from testkit.kill import descendants, kill_when
from testkit.models import save_coin_model
from testkit.recipes import coin_recipe

from headedit import pipeline  # noqa: E402
from headedit.errors import RunError  # noqa: E402
from headedit.pipeline.parallel import MirrorJournal, Placement, place, share  # noqa: E402
from headedit.recipe import parse_recipe  # noqa: E402

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
N = 64
STAGE_FILES = ("screen.json", "search.json", "selection.json")
ENTRY = f"""import sys
sys.path.insert(0, {str(TESTS)!r})
import testkit.coin  # registers coin-test in every process
from headedit.cli import main
sys.exit(main())
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp: Path, *args: str) -> subprocess.Popen:
    entry = tmp / "entry.py"
    entry.write_text(ENTRY)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_port()), str(entry), *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("dist")
    model = save_coin_model(root / "model")
    recipe_file = root / "r.toml"
    recipe_file.write_text(coin_recipe(model, discovery=N))
    one = pipeline.discover(parse_recipe(recipe_file.read_text(), recipe_file), root / "one")
    return {"root": root, "recipe": recipe_file, "one": one}


def test_two_processes_give_the_one_process_journal_and_selection(setup) -> None:
    root, one = setup["root"], setup["one"]
    two = root / "two"
    proc = _torchrun(root, "discover", str(setup["recipe"]), "--out", str(two))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    selected = json.loads((one / "selection.json").read_text())["heads"]
    lines = out.strip().splitlines()
    assert lines[-1] == f"selected: {selected}"
    assert sum(line.startswith("selected:") for line in lines) == 1  # only rank 0 prints
    assert journal_rows(two, stage=True) == journal_rows(one, stage=True)  # same rows, same bits, same stages
    assert len(journal_rows(one, stage=True)) > 13  # screen (12 heads + intact) and search sets
    for name in STAGE_FILES:
        assert json.loads((two / name).read_text()) == json.loads((one / name).read_text()), name
    assert journal_work(two) == journal_work(one)  # every (set, example) evaluated once in all, not once per process
    info = json.loads((two / "run.json").read_text())
    assert info["environment"]["processes"] == "2" and info["environment"]["device"] == "cpu"


def test_two_process_run_killed_then_resumed_with_one(setup) -> None:
    root, one = setup["root"], setup["one"]
    run_dir = root / "killed"
    proc = _torchrun(root, "discover", str(setup["recipe"]), "--out", str(run_dir))
    # torchrun and both workers, at once (the workers run in their own sessions)
    killed = kill_when(proc, lambda: evaluations(run_dir, "heads != ''") >= 2, timeout=240,
                       pids=lambda: [proc.pid, *descendants(proc.pid)])
    proc.communicate(timeout=60)
    assert killed, "the 2-process run finished before it could be killed"
    assert not (run_dir / "selection.json").exists()
    before = journal_rows(run_dir, stage=True)
    assert before and len(before) < len(journal_rows(one, stage=True))

    resumed = pipeline.discover(None, run_dir, resume=True)  # one process now
    assert journal_rows(resumed, stage=True) == journal_rows(one, stage=True)
    assert all(journal_rows(resumed, stage=True)[k][0] >= v[0] for k, v in before.items())
    assert journal_work(resumed) == journal_work(one)  # nothing the 2 processes finished was evaluated again
    for name in STAGE_FILES:
        assert json.loads((resumed / name).read_text()) == json.loads((one / name).read_text()), name


# ---- the pieces -------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [0, 1, 5, 16, 17, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_share_is_a_contiguous_partition(count: int, world: int) -> None:
    slices = [share(count, r, world) for r in range(world)]
    assert slices[0][0] == 0 and slices[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))
    sizes = [hi - lo for lo, hi in slices]
    assert max(sizes) - min(sizes) <= 1


def test_placement() -> None:
    assert place("cpu", None, 0, 1, 4) == Placement("cpu")
    assert place("auto", None, 0, 1, 0) == Placement("cpu")
    assert place("auto", None, 0, 1, 2) == Placement("cuda:0")
    assert place("cuda:1", None, 0, 1, 2) == Placement("cuda:1")
    # one replica per GPU under torchrun
    assert [place("auto", None, r, 4, 4).device for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    # a model too big for one GPU: each of 2 processes spreads its replica over its own 2 of 4 GPUs
    p = place("auto", {"0": "70GiB", "cpu": "100GiB"}, 1, 2, 4)
    assert p.device == "cuda:2" and p.device_map == "auto" and p.max_memory == {2: "70GiB", 3: "70GiB", "cpu": "100GiB"}
    single = place("auto", {"0": "60GiB", "1": "60GiB"}, 0, 1, 2)
    assert single.device_map == "auto" and single.max_memory == {0: "60GiB", 1: "60GiB"}
    assert single.backend == "nccl" and Placement("cpu").backend == "gloo"
    with pytest.raises(RunError, match="only 2 GPUs"):
        place("auto", None, 0, 4, 2)
    with pytest.raises(RunError, match="names GPU 3"):
        place("auto", {"3": "10GiB"}, 0, 1, 2)
    with pytest.raises(RunError, match="no CUDA GPU"):
        place("cuda", None, 0, 1, 0)


def test_mirror_journal_keeps_the_longest_prefix() -> None:
    import numpy as np

    j = MirrorJournal([])
    j.put("discovery", "0.1", np.array([True, False]), "s", 2)
    j.put("discovery", "0.1", np.array([True, False, True]), "t", 1)
    e = j.get("discovery", "0.1")
    assert e.n == 3 and e.stage == "s" and e.bits.tolist() == [True, False, True]
    assert j.put("discovery", "0.1", np.array([True]), "u", 1).n == 3
