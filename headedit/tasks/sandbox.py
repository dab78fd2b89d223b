"""Run untrusted generated programs (MBPP) so that nothing they do can hurt the evaluator or the machine.

Layers, outermost first (each one alone would stop the hostile programs in tests/test_sandbox.py):
- a fresh `python -I` process per program, in a new session/process group, in a new temporary folder as cwd,
  with an environment holding only PATH; the whole group is SIGKILLed after a wall-clock backstop;
- where `unshare` works (root): private network namespace (no network at all) and private PID namespace
  (every descendant dies with the sandbox, `kill(-1)` reaches nothing outside);
- as root: the runner drops to a throwaway uid (one per concurrent run) keeping only CAP_DAC_READ_SEARCH
  (so it can still import the stdlib under /root), with no_new_privs; files it does not own are then
  read-only to it and RLIMIT_NPROC becomes effective;
- resource limits: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps;
- in-process guards before user code, like OpenAI human-eval's `reliability_guard`: sockets, os.kill/system/
  fork/exec/spawn, subprocess, shutil.rmtree, chmod/chown, exit()/quit() disabled; remove/unlink/rmdir/rename
  and writing opens refused outside the program's folder.

A pass needs proof that the asserts ran: the runner writes a per-run random nonce after they return, on a
descriptor the program's own output does not go to. `sys.exit(0)`/`os._exit(0)` before the asserts fail.
Known limit: code that deliberately introspects the runner's memory could forge the nonce (as in human-eval).
"""
from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Literal, NamedTuple, Sequence

Status = Literal["passed", "failed", "timeout", "error", "killed"]

UID_BASE = 61000  # throwaway uids for sandboxed programs when running as root
UID_SPAN = 4000
GRACE_S = 3.0  # interpreter start-up allowance before the parent's backstop kill
NPROC_LIMIT = 32  # processes/threads a sandboxed program may have (per throwaway uid)
FSIZE_MB = 16  # largest file a program may write (its stdout/stderr included)


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
    """Which kernel-level layers are active for this process; the in-process guards always are."""

    network_namespace: bool
    pid_namespace: bool
    drop_privileges: bool

    def describe(self) -> str:
        parts = [name for name, on in (("netns", self.network_namespace), ("pidns", self.pid_namespace),
                                       ("uid-drop", self.drop_privileges)) if on]
        return "+".join(parts + ["rlimits", "guards"])


# The child: reads its job, applies limits and guards, runs the program, reports on a private descriptor.
_RUNNER = r'''
import os, sys, json
def _main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    os.unlink(sys.argv[1])
    nonce = job.pop("nonce").encode()
    status_fd = os.dup(1)
    os.dup2(2, 1)  # the program's own prints go to the size-limited log, never to the status channel
    write, _exit = os.write, os._exit
    def report(text):
        write(status_fd, text.encode("utf-8", "replace")[:2000])
    import resource, signal, builtins, ctypes
    mb = 1024 * 1024
    def limit(res, value):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_FSIZE, job["fsize_mb"] * mb)
    limit(resource.RLIMIT_NOFILE, 256)
    cpu = int(job["timeout_s"]) + 2
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except (ValueError, OSError):
        pass
    nproc = job["nproc"]
    if job["uid"] is None:  # not root: the count is per real uid, so leave room for what already runs
        me = os.getuid()
        tasks = 0
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and os.stat("/proc/" + p).st_uid == me:
                    tasks += len(os.listdir("/proc/%s/task" % p))
            except OSError:
                pass
        nproc += tasks
    limit(resource.RLIMIT_NPROC, nproc)
    libc = ctypes.CDLL(None, use_errno=True)
    if job["uid"] is not None:
        uid = job["uid"]
        libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS: keep the permitted set across setresuid
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        class Hdr(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
        data = (Data * 2)()
        data[0].effective = data[0].permitted = 1 << 2  # CAP_DAC_READ_SEARCH only: read the stdlib, write nothing
        if libc.capset(ctypes.byref(Hdr(0x20080522, 0)), data) != 0:
            report("error: capset failed")
            _exit(3)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    limit(resource.RLIMIT_AS, job["memory_mb"] * mb)
    class _Timeout(BaseException):
        pass
    def on_alarm(signum, frame):
        raise _Timeout()
    signal.signal(signal.SIGALRM, on_alarm)
    setitimer, ITIMER_REAL = signal.setitimer, signal.ITIMER_REAL
    _guard()
    program = job["code"] + "\n" + job["setup"] + "\n" + "\n".join(job["tests"]) + "\n"
    del job
    # Re-arm every 0.1 s so a program that swallows one timeout still gets the next.
    setitimer(ITIMER_REAL, float(_TIMEOUT), 0.1)
    try:
        exec(compile(program, "<program>", "exec"), {})  # empty globals, as HF code_eval does
        setitimer(ITIMER_REAL, 0)
        report(nonce.decode())
    except _Timeout:
        setitimer(ITIMER_REAL, 0)
        report("timeout")
    except BaseException as err:
        setitimer(ITIMER_REAL, 0)
        try:
            report("failed: %s: %s" % (type(err).__name__, str(err)[:300]))
        except BaseException:
            report("failed: %s" % type(err).__name__)
    _exit(0)

def _guard():
    import builtins, shutil, subprocess, socket, _socket, signal
    home = os.path.realpath(os.getcwd())
    def inside(path):
        try:
            if isinstance(path, int):
                return True
            real = os.path.realpath(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError):
            return False
        return real == home or real.startswith(home + os.sep) or real == "/dev/null"
    def refuse(name):
        def blocked(*args, **kwargs):
            raise PermissionError(name + " is disabled in the sandbox")
        return blocked
    def confined(name, fn, nargs=1):
        def checked(*args, **kwargs):
            if not all(inside(a) for a in args[:nargs]):
                raise PermissionError(name + " outside the sandbox folder is disabled")
            return fn(*args, **kwargs)
        return checked
    real_open, real_os_open = builtins.open, os.open
    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and not inside(file):
            raise PermissionError("writing outside the sandbox folder is disabled")
        return real_open(file, mode, *args, **kwargs)
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & writing and not inside(path):
            raise PermissionError("writing outside the sandbox folder is disabled")
        return real_os_open(path, flags, *args, **kwargs)
    builtins.open = guarded_open
    import io
    io.open = guarded_open
    os.open = guarded_os_open
    for name in ("remove", "unlink", "rmdir", "removedirs", "truncate", "mkdir", "makedirs", "mkfifo", "mknod"):
        if hasattr(os, name):
            setattr(os, name, confined("os." + name, getattr(os, name)))
    for name in ("rename", "renames", "replace", "link", "symlink"):
        if hasattr(os, name):
            setattr(os, name, confined("os." + name, getattr(os, name), 2))
    for name in ("kill", "killpg", "system", "popen", "fork", "forkpty", "vfork", "posix_spawn", "posix_spawnp",
                 "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                 "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
                 "setuid", "seteuid", "setreuid", "setresuid", "setgid", "setsid", "setpgid", "putenv", "unsetenv",
                 "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown", "chroot", "chdir", "fchdir",
                 "register_at_fork", "pidfd_open"):
        if hasattr(os, name):
            setattr(os, name, refuse("os." + name))
    for name in ("rmtree", "move", "chown", "copytree"):
        setattr(shutil, name, refuse("shutil." + name))
    for name in ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"):
        setattr(subprocess, name, refuse("subprocess." + name))
    for mod in (socket, _socket):
        for name in ("socket", "socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo"):
            if hasattr(mod, name):
                setattr(mod, name, refuse("socket." + name))
    for name in ("signal", "setitimer", "alarm", "pthread_sigmask", "pthread_kill", "siginterrupt", "set_wakeup_fd"):
        if hasattr(signal, name):  # the runner's timer must keep working
            setattr(signal, name, refuse("signal." + name))
    builtins.exit = refuse("exit()")
    builtins.quit = refuse("quit()")
    for name in ("ipdb", "joblib", "psutil", "tkinter", "resource"):
        sys.modules[name] = None

_TIMEOUT = float(sys.argv[2])
_main()
'''

_uid_counter = itertools.count()
_uid_lock = threading.Lock()


def _next_uid() -> int:
    with _uid_lock:
        return UID_BASE + next(_uid_counter) % UID_SPAN


@lru_cache(maxsize=4)
def _unshare_prefix(euid: int) -> tuple[str, ...]:
    """The widest `unshare` that works here (probed once per euid); () when none does."""
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


def isolation() -> Isolation:
    prefix = _unshare_prefix(os.geteuid())
    return Isolation(network_namespace="--net" in prefix, pid_namespace="--pid" in prefix,
                     drop_privileges=os.geteuid() == 0)


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


def run_program(code: str, tests: Sequence[str], setup: str = "", timeout_s: float = 10,
                memory_mb: int = 512) -> SandboxResult:
    """Run `code`, then `setup`, then each test line in one fresh sandboxed interpreter.

    `timeout_s` bounds the program's own run time (the timer starts after interpreter start-up, as in
    HF code_eval); the parent kills the whole process group at `timeout_s + GRACE_S` regardless.
    """
    nonce = secrets.token_hex(16)
    euid = os.geteuid()
    uid = _next_uid() if euid == 0 else None
    work = Path(tempfile.mkdtemp(prefix="headedit-sbx-"))
    try:
        os.chmod(work, 0o711)  # the program may pass through to its folder, never list or read ours
        box = work / "box"
        box.mkdir(mode=0o700)
        if uid is not None:
            os.chown(box, uid, uid)
        job_path = work / "job.json"
        fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"nonce": nonce, "code": code, "setup": setup, "tests": list(tests), "uid": uid,
                       "memory_mb": int(memory_mb), "timeout_s": float(timeout_s), "nproc": NPROC_LIMIT,
                       "fsize_mb": FSIZE_MB}, fh)
        cmd = [*_unshare_prefix(euid), sys.executable, "-I", "-B", "-c", _RUNNER, str(job_path), repr(float(timeout_s))]
        with open(work / "status", "wb") as status, open(work / "log", "wb") as log:
            try:
                proc = subprocess.Popen(cmd, cwd=box, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                        stdin=subprocess.DEVNULL, stdout=status, stderr=log,
                                        start_new_session=True, close_fds=True)
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
        report = _read_tail(work / "status").strip()
        if report == nonce:
            return SandboxResult(True, "passed", "")
        if not exited:
            return SandboxResult(False, "timeout", f"killed after {float(timeout_s) + GRACE_S:g}s wall clock")
        if report == "timeout":
            return SandboxResult(False, "timeout", f"still running after {float(timeout_s):g}s")
        if report.startswith("failed"):
            return SandboxResult(False, "failed", report[len("failed: "):])
        if report.startswith("error"):
            return SandboxResult(False, "error", report[len("error: "):])
        if ran_s >= float(timeout_s) and returncode != 0:
            # Outlived its budget and died without a report: the CPU-time rlimit (SIGXCPU, then SIGKILL) or
            # the backstop stopped it. Under `unshare --kill-child` the signal is not passed on (exit 1).
            return SandboxResult(False, "timeout", f"stopped by the CPU-time limit after {ran_s:.1f}s")
        if returncode < 0 or returncode >= 128:
            signum = -returncode if returncode < 0 else returncode - 128
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = f"signal {signum}"
            return SandboxResult(False, "killed", f"terminated by {name}")
        if returncode == 0:
            return SandboxResult(False, "failed", "exited before the tests finished")
        tail = _read_tail(work / "log", 600).strip().splitlines()
        return SandboxResult(False, "error" if returncode != 1 else "failed",
                             f"exit status {returncode}" + (f": {tail[-1]}" if tail else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
