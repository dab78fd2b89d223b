"""Start a command and SIGKILL it at a chosen moment; find the processes it started.

The fault tests (kill -9 during discover, bake, validate, push) and the multi-process tests share these.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    killed: bool
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a headedit subprocess: this checkout first on the path, one thread (bit-equal logits)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(extra or {})
    return env


def run_and_kill(cmd: list[str], env: dict[str, str], trigger: Callable[[float], bool] | None, delay: float = 0.0,
                 watch: Callable[[], None] | None = None, cwd: Path = ROOT, timeout: float = 240) -> Outcome:
    """Start `cmd`; once `trigger(elapsed)` holds, wait `delay` seconds and SIGKILL it (if still running).

    `watch` is called every few milliseconds for the whole life of the process (e.g. to check what is visible
    at a target path). Output goes to files, so a killed process never blocks on a full pipe.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        fire_at: float | None = None
        killed = False
        try:
            while proc.poll() is None:
                now = time.monotonic() - start
                if now > timeout:
                    proc.kill()
                    raise AssertionError(f"{cmd[3:]} ran over {timeout}s")
                if watch is not None:
                    watch()
                if fire_at is None and trigger is not None and trigger(now):
                    fire_at = now + delay
                if fire_at is not None and now >= fire_at and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.003)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if watch is not None:
            watch()
        seconds = time.monotonic() - start
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    return Outcome(killed and proc.returncode == -signal.SIGKILL, proc.returncode, stdout, stderr, seconds)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its workers in their own sessions, so killpg misses them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_when(proc: subprocess.Popen, condition: Callable[[], bool], timeout: float,
              pids: Callable[[], list[int]] | None = None) -> bool:
    """Poll `condition` every few milliseconds while `proc` runs; when it holds, SIGKILL `pids()` (default: the
    process alone) at once and return True. False when the process ended or `timeout` passed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            for pid in (pids() if pids is not None else [proc.pid]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return True
        time.sleep(0.003)
    return False
