"""Run untrusted generated programs (MBPP) so that nothing they do can hurt the evaluator or forge a pass.

What is guaranteed, in which setting, and the test that checks each promise: docs/sandbox.md.

Isolation (`isolation()` says which applies):
- "bwrap" (bubblewrap works here, as root or through an unprivileged user namespace; sandbox_bwrap.py): a private
  mount namespace holding only read-only system and Python folders plus a private tmpfs /tmp; private network,
  PID, IPC and UTS namespaces; no environment but PATH; as root a throwaway uid with every capability dropped;
  a seccomp filter against new user namespaces.
- "weak" (no usable bubblewrap, or HEADEDIT_SANDBOX=weak): the earlier layers only, announced by a one-line
  warning: `unshare` network/PID namespaces where they work, as root a throwaway uid that keeps
  CAP_DAC_READ_SEARCH (it can read every file). HEADEDIT_SANDBOX=bwrap refuses to run without bubblewrap.
Both: rlimits (address space, CPU, processes, file size, descriptors), a new session killed as a whole after a
wall-clock backstop, and Python-level guards that turn accidents into readable errors (not a boundary).

Verdict (sandbox_verdict.py): the asserts' outcomes are decided outside the program's process, which reports only
the values of the asserts' leaves, as plain data; comparisons run here, or in a separate sandboxed check job that
runs no program code. The program-side runner is sandbox_runner.py.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Literal, NamedTuple, Sequence

from headedit.errors import TaskError
from headedit.tasks.sandbox_bwrap import bwrap_argv, open_seccomp, python_path, site_paths
from headedit.tasks.sandbox_runner import MAX_REPORT
from headedit.tasks.sandbox_verdict import TestShapeError, fast_verdict, leaf_entries, plan_tests

Status = Literal["passed", "failed", "timeout", "error", "killed"]
Mode = Literal["bwrap", "weak"]

UID_BASE = 61000  # throwaway uids for sandboxed programs when running as root
UID_SPAN = 4000
GRACE_S = 3.0  # interpreter start-up allowance before the parent's backstop kill
NPROC_LIMIT = 32  # processes/threads a sandboxed program may have
FSIZE_MB = 16  # largest file a program may write (its stdout/stderr included)
CHECK_TIMEOUT_S = 5.0  # a check job runs no program code: comparisons of plain data only
RUNNER = (Path(__file__).parent / "sandbox_runner.py").read_text(encoding="utf-8")
log = logging.getLogger("headedit.sandbox")


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: Status  # passed | failed | timeout | error | killed
    detail: str  # short reason: the exception, the signal, or why the sandbox could not run it


class Program(NamedTuple):
    code: str
    tests: Sequence[str]
    setup: str = ""


@dataclass(frozen=True)
class Isolation:
    """Which kernel-level layers are active for this process; rlimits and the outside verdict always are."""

    mode: Mode
    network_namespace: bool
    pid_namespace: bool
    drop_privileges: bool  # as root: a throwaway uid (so RLIMIT_NPROC holds)
    private_filesystem: bool  # only an allowlist of read-only folders plus a private tmpfs is visible
    no_capabilities: bool
    reason: str  # why bubblewrap is not used ("" when it is)

    def describe(self) -> str:
        parts = [name for name, on in (("fs", self.private_filesystem), ("netns", self.network_namespace),
                                       ("pidns", self.pid_namespace), ("uid-drop", self.drop_privileges),
                                       ("no-caps", self.no_capabilities)) if on]
        return f"{self.mode}: " + "+".join(parts + ["rlimits"])


_uid_counter = itertools.count()
_uid_lock = threading.Lock()
_warned = threading.Event()


def _next_uid() -> int:
    with _uid_lock:
        return UID_BASE + next(_uid_counter) % UID_SPAN


@lru_cache(maxsize=4)
def _bwrap_problem(euid: int) -> str | None:
    """Why bubblewrap cannot sandbox here (probed once per euid), or None when it can."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if euid == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    with tempfile.TemporaryDirectory(prefix="headedit-sbx-probe-") as folder:
        fd = open_seccomp(Path(folder))
        cmd = [*bwrap_argv(UID_BASE + UID_SPAN if euid == 0 else None, fd), python_path(), "-I", "-S", "-c", "import os"]
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  timeout=20, check=False, pass_fds=() if fd is None else (fd,))
        except (OSError, subprocess.SubprocessError) as err:
            return f"bwrap could not start: {err}"
        finally:
            if fd is not None:
                os.close(fd)
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed here: {tail[-1] if tail else f'exit status {done.returncode}'}"
    return None


@lru_cache(maxsize=4)
def _unshare_prefix(euid: int) -> tuple[str, ...]:
    """Weak mode: the widest `unshare` that works here (probed once per euid); () when none does."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    for flags in (("--net", "--pid", "--fork", "--kill-child"), ("--net",)):
        cmd = (exe, *flags, "--")
        try:
            done = subprocess.run([*cmd, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return cmd
    return ()


def _mode() -> tuple[Mode, str]:
    """bwrap when it works; otherwise the weak mode with a loud warning, or a refusal under HEADEDIT_SANDBOX=bwrap."""
    want = (os.environ.get("HEADEDIT_SANDBOX") or "auto").strip().lower()
    if want not in ("auto", "bwrap", "weak"):
        raise TaskError(f"HEADEDIT_SANDBOX={want!r} is not a sandbox mode", "use auto, bwrap or weak")
    if want == "weak":
        return "weak", "HEADEDIT_SANDBOX=weak"
    problem = _bwrap_problem(os.geteuid())
    if problem is None:
        return "bwrap", ""
    if want == "bwrap":
        raise TaskError(f"HEADEDIT_SANDBOX=bwrap but {problem}",
                        "install bubblewrap (apt-get install bubblewrap) or unset HEADEDIT_SANDBOX")
    if not _warned.is_set():
        _warned.set()
        harm = "read your files and write world-writable folders" if os.geteuid() == 0 else "read and change your files"
        log.warning("WARNING: %s; model-written code runs in the WEAK sandbox, where it can %s: install bubblewrap "
                    "(docs/sandbox.md)", problem, harm)
    return "weak", problem


def isolation() -> Isolation:
    mode, reason = _mode()
    root = os.geteuid() == 0
    if mode == "bwrap":
        return Isolation("bwrap", True, True, root, True, True, "")
    prefix = _unshare_prefix(os.geteuid())
    return Isolation("weak", "--net" in prefix, "--pid" in prefix, root, False, False, reason)


def _read_tail(path: Path, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait for `pid` to exit without reaping it (so its process group id cannot be reused); False on timeout."""
    delay = 0.002
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _run_job(job: dict, timeout_s: float, memory_mb: int) -> SandboxResult | dict:
    """Run one runner job in a fresh sandbox: its parsed one-line report, or why there is none."""
    mode, _ = _mode()
    euid = os.geteuid()
    uid = _next_uid() if euid == 0 else None
    work = Path(tempfile.mkdtemp(prefix="headedit-sbx-"))
    seccomp_fd: int | None = None
    try:
        job = {**job, "timeout_s": float(timeout_s), "memory_mb": int(memory_mb), "nproc": NPROC_LIMIT,
               "fsize_mb": FSIZE_MB, "sys_path": site_paths(), "weak_uid": uid if mode == "weak" else None,
               "count_own_tasks": mode == "weak" and uid is None, "expect_no_caps": mode == "bwrap"}
        if mode == "bwrap":
            seccomp_fd = open_seccomp(work)
            cwd, prefix = work, bwrap_argv(uid, seccomp_fd)
        else:
            os.chmod(work, 0o711)  # the program may pass through to its folder, never list or read ours
            cwd = work / "box"
            cwd.mkdir(mode=0o700)
            if uid is not None:
                os.chown(cwd, uid, uid)
            prefix = list(_unshare_prefix(euid))
        (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        cmd = [*prefix, python_path(), "-I", "-S", "-B", "-c", RUNNER]
        with open(work / "job.json", "rb") as stdin, open(work / "report", "wb") as report, \
                open(work / "log", "wb") as logfile:
            try:
                proc = subprocess.Popen(cmd, cwd=cwd, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                        stdin=stdin, stdout=report, stderr=logfile, start_new_session=True,
                                        close_fds=True, pass_fds=() if seccomp_fd is None else (seccomp_fd,))
            except OSError as err:
                return SandboxResult(False, "error", f"could not start the sandbox: {err}")
            started = time.monotonic()
            exited = _wait_unreaped(proc.pid, time.monotonic() + float(timeout_s) + GRACE_S)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group; the leader is still unreaped
            except (ProcessLookupError, PermissionError):
                pass
            returncode = proc.wait()
            ran_s = time.monotonic() - started
        parsed = _parse_report(work / "report")
        if isinstance(parsed, dict):
            if "timeout" in parsed:
                return SandboxResult(False, "timeout", f"still running after {float(timeout_s):g}s")
            if "failed" in parsed:
                return SandboxResult(False, "failed", str(parsed["failed"])[:500])
            if "error" in parsed:
                return SandboxResult(False, "error", str(parsed["error"])[:500])
            return parsed
        if not exited:
            return SandboxResult(False, "timeout", f"killed after {float(timeout_s) + GRACE_S:g}s wall clock")
        if ran_s >= float(timeout_s) and returncode != 0:
            # Outlived its budget and died without a report: the CPU-time rlimit (SIGXCPU, then SIGKILL) or the
            # backstop stopped it. bwrap and `unshare --kill-child` do not pass the signal on.
            return SandboxResult(False, "timeout", f"stopped by the CPU-time limit after {ran_s:.1f}s")
        if returncode < 0 or returncode >= 128:
            signum = -returncode if returncode < 0 else returncode - 128
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = f"signal {signum}"
            return SandboxResult(False, "killed", f"terminated by {name}")
        if returncode == 0:
            return SandboxResult(False, "failed", "exited before the tests finished" +
                                 (" (its report was not valid)" if parsed else ""))
        tail = _read_tail(work / "log", 600).strip().splitlines()
        if any(line.startswith(("bwrap:", "setpriv:", "unshare:")) for line in tail):
            return SandboxResult(False, "error", f"the sandbox could not start: {tail[-1]}")  # not the program's verdict
        return SandboxResult(False, "error" if returncode != 1 else "failed",
                             f"exit status {returncode}" + (f": {tail[-1]}" if tail else ""))
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        shutil.rmtree(work, ignore_errors=True)


def _parse_report(path: Path) -> dict | str:
    """The report as a one-key dict, "" when there is none, or "invalid" (the program may write anything)."""
    try:
        if path.stat().st_size > MAX_REPORT + 4096:
            return "invalid"
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return "invalid"
    if not text.strip():
        return ""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return "invalid"
    return data if isinstance(data, dict) and len(data) == 1 else "invalid"


def run_program(code: str, tests: Sequence[str], setup: str = "", timeout_s: float = 10,
                memory_mb: int = 512) -> SandboxResult:
    """Run `code`, then `setup`, then the tests in one fresh sandbox; the asserts are decided outside it.

    `timeout_s` bounds the program's own run time (the timer starts after interpreter start-up, as in
    HF code_eval); the parent kills the whole sandbox at `timeout_s + GRACE_S` regardless.
    """
    try:
        plan = plan_tests(code, setup, list(tests))
    except TestShapeError as err:
        return SandboxResult(False, "error", str(err))
    outcome = _run_job({"kind": "program", "code": code, "setup": setup, "steps": plan.steps}, timeout_s, memory_mb)
    if isinstance(outcome, SandboxResult):
        return outcome
    steps = leaf_entries(plan, outcome)
    if steps is None:
        return SandboxResult(False, "failed", "the program's report does not match its tests (it interfered)")
    verdicts = [fast_verdict(check, entries) for check, entries in zip(plan.asserts, steps)]
    pending = [i for i, v in enumerate(verdicts) if v is None]
    if pending and all(v is None or v[0] for v in verdicts):
        checked = _run_job({"kind": "check", "asserts": [{"template": plan.asserts[i].template, "leaves": steps[i]}
                                                         for i in pending]}, CHECK_TIMEOUT_S, memory_mb)
        results = checked.get("verdicts") if isinstance(checked, dict) else None
        if not (isinstance(results, list) and len(results) == len(pending)
                and all(isinstance(r, list) and len(r) == 2 for r in results)):
            why = checked.detail if isinstance(checked, SandboxResult) else "an unreadable report"
            return SandboxResult(False, "error", f"the check job failed: {why}")
        for i, (ok, why) in zip(pending, results):
            verdicts[i] = (ok is True, why or f"AssertionError: {plan.asserts[i].source}")
    for v in verdicts:
        if v is not None and not v[0]:
            return SandboxResult(False, "failed", v[1])
    return SandboxResult(True, "passed", "")


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def run_many(programs: Iterable[Program | tuple], timeout_s: float = 10, memory_mb: int = 512,
             workers: int | None = None) -> list[SandboxResult]:
    """Run many programs, at most `workers` at once; results in input order."""
    jobs = [p if isinstance(p, Program) else Program(*p) for p in programs]
    if not jobs:
        return []
    n = max(1, min(workers or default_workers(), len(jobs)))

    def one(p: Program) -> SandboxResult:
        return run_program(p.code, p.tests, p.setup, timeout_s=timeout_s, memory_mb=memory_mb)

    if n == 1:
        return [one(p) for p in jobs]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="headedit-sandbox") as pool:
        return list(pool.map(one, jobs))


__all__ = ["Isolation", "Program", "SandboxResult", "isolation", "run_many", "run_program"]
