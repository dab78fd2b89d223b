"""The code sandbox: correct programs pass, wrong and hostile ones fail, and nothing outside leaks or breaks."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from headedit.tasks.sandbox import UID_BASE, UID_SPAN, GRACE_S, Program, isolation, run_many, run_program

T = 2.0  # each hostile program's own time budget; the parent's backstop is T + GRACE_S
KERNEL = isolation()
needs_pidns = pytest.mark.skipif(not KERNEL.pid_namespace, reason="no PID namespace here (unshare unavailable)")
needs_drop = pytest.mark.skipif(not KERNEL.drop_privileges, reason="not root: no throwaway uid")


def run(code: str, tests: list[str] | None = None, timeout_s: float = T) -> tuple:
    start = time.monotonic()
    result = run_program(code, tests if tests is not None else ["assert True"], timeout_s=timeout_s)
    elapsed = time.monotonic() - start
    assert elapsed < timeout_s + GRACE_S + 3, f"sandbox took {elapsed:.1f}s"
    return result, elapsed


def sandbox_processes() -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if UID_BASE <= os.stat(f"/proc/{pid}").st_uid < UID_BASE + UID_SPAN:
                    n += 1
            except OSError:
                pass
    return n


@pytest.fixture
def sentinel(tmp_path):
    path = tmp_path / "sentinel.txt"
    path.write_text("keep me")
    before = sorted(p.name for p in tmp_path.iterdir())
    yield path
    assert path.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_correct_program_passes_and_wrong_one_fails():
    ok, _ = run("def add(a, b):\n    return a + b", ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"])
    assert ok.passed and ok.status == "passed"
    bad, _ = run("def add(a, b):\n    return a * b", ["assert add(1, 2) == 3"])
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.detail
    syntax, _ = run("def add(a, b) return a", ["assert add(1, 2) == 3"])
    assert syntax.status == "failed" and "SyntaxError" in syntax.detail


def test_setup_runs_between_code_and_tests():
    res, _ = run("class Node:\n    def __init__(self, v): self.v = v", ["assert root.v == 7"])
    assert res.status == "failed"
    res = run_program("class Node:\n    def __init__(self, v): self.v = v", ["assert root.v == 7"], setup="root = Node(7)")
    assert res.passed


def test_program_may_use_its_own_folder_and_the_stdlib():
    code = ("import os, math, re, heapq, collections, itertools, json\n"
            "open('scratch.txt', 'w').write('x')\nos.remove('scratch.txt')\nos.mkdir('d')\nos.rmdir('d')")
    res, _ = run(code, ["assert math.isqrt(16) == 4", "assert not os.path.exists('scratch.txt')"])
    assert res.passed, res


def test_exit_before_the_asserts_is_not_a_pass():
    for code in ("import sys\nsys.exit(0)", "raise SystemExit(0)", "import os\nos._exit(0)", "exit()", "quit()"):
        res, _ = run(code, ["assert False"])
        assert not res.passed and res.status == "failed", (code, res)


def test_printing_cannot_fake_a_pass():
    res, _ = run("import sys\nprint('passed')\nsys.stdout.flush()\nimport os\nos.write(1, b'passed\\n')", ["assert False"])
    assert not res.passed


def test_infinite_loops_time_out():
    res, _ = run("while True:\n    pass", timeout_s=1)
    assert res.status == "timeout" and not res.passed
    # a loop that swallows the timeout exception is still stopped (the timer re-arms)
    res, _ = run("while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass",
                 timeout_s=1)
    assert res.status == "timeout" and not res.passed
    res, _ = run("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass", timeout_s=1)
    assert not res.passed and "signal.signal is disabled" in res.detail


def test_backstop_kills_a_program_that_ignores_the_timer():
    # below the Python guards, SIGALRM ignored through libc: only the parent's process-group kill is left
    res, elapsed = run("import ctypes\nctypes.CDLL(None).signal(14, ctypes.c_void_p(1))\nwhile True:\n    pass",
                       timeout_s=1)
    assert res.status == "timeout" and not res.passed
    assert elapsed >= 1 + GRACE_S - 0.5


def test_huge_allocation_fails():
    res, _ = run("x = bytearray(10 * 1024 ** 3)\nx[-1] = 1")
    assert not res.passed and res.status in ("failed", "killed")
    assert "MemoryError" in res.detail or res.status == "killed"


def test_fork_bomb_is_refused():
    res, _ = run("import os\nwhile True:\n    os.fork()")
    assert not res.passed and "fork" in res.detail
    res, _ = run("import multiprocessing\nps = [multiprocessing.Process(target=print) for _ in range(100)]\n"
                 "[p.start() for p in ps]")
    assert not res.passed


@needs_drop
def test_kernel_level_fork_bomb_is_bounded_and_reaped():
    code = "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()"
    res, _ = run(code)
    assert not res.passed and res.status in ("timeout", "killed")
    deadline = time.monotonic() + 5
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_processes() == 0


def test_escaped_children_die_with_the_sandbox():
    # a child that starts its own session (leaving the process group) must not outlive the run
    code = ("import ctypes\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    libc.setsid()\n"
            "    while True:\n        pass\n")
    res, _ = run(code, ["assert False"])
    assert not res.passed
    if KERNEL.drop_privileges:
        time.sleep(0.5)
        assert sandbox_processes() == 0


def test_deleting_or_overwriting_files_outside_is_refused(sentinel):
    target = str(sentinel)
    folder = str(sentinel.parent)
    attempts = [
        f"import os\nos.remove({target!r})",
        f"import os\nos.unlink({target!r})",
        f"import shutil\nshutil.rmtree({folder!r})",
        f"open({target!r}, 'w').write('gone')",
        f"import os\nos.rename({target!r}, {target + '.moved'!r})",
        f"open({folder + '/new.txt'!r}, 'w').write('x')",
        f"import pathlib\npathlib.Path({target!r}).unlink()",
        f"import os\nos.system('rm -f {target}')",
        f"import subprocess\nsubprocess.run(['rm', '-f', {target!r}])",
    ]
    if KERNEL.drop_privileges:  # below the Python guards: the kernel refuses a uid that owns nothing here
        attempts.append(f"import ctypes\nassert ctypes.CDLL(None).unlink({target.encode()!r}) == 0")
    for code in attempts:
        res, _ = run(code)
        assert not res.passed, (code, res)
        assert sentinel.exists(), code


def test_network_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    connections: list = []

    def accept() -> None:
        end = time.monotonic() + 15
        while time.monotonic() < end and not stop.is_set():
            try:
                connections.append(server.accept()[0])
            except OSError:
                pass

    stop = threading.Event()
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        attempts = [
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
            f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))",
            f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))",
            f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)",
        ]
        for code in attempts:
            res, _ = run(code)
            assert not res.passed, (code, res)
        if KERNEL.network_namespace:  # even a raw syscall finds no network
            res, _ = run("import ctypes, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
                         f"addr = struct.pack('!HH4s8x', 2, {port}, bytes([127, 0, 0, 1]))\n"
                         "addr = struct.pack('H', 2) + addr[2:]\n"
                         "assert libc.connect(fd, addr, len(addr)) == 0")
            assert not res.passed
    finally:
        stop.set()
        thread.join()
        server.close()
    assert connections == []


def test_killing_the_parent_is_contained():
    res, _ = run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", ["assert False"])
    assert not res.passed and "kill" in res.detail
    res, _ = run("import os\nos.killpg(0, 9)", ["assert False"])
    assert not res.passed


@needs_pidns
def test_kernel_level_kill_reaches_nothing_outside():
    for code in ("import os, ctypes\nctypes.CDLL(None).kill(os.getppid(), 9)", "import ctypes\nctypes.CDLL(None).kill(-1, 9)"):
        res, _ = run(code, ["assert False"])
        assert not res.passed
    assert run_program("x = 1", ["assert x == 1"]).passed  # and we are all still here


def test_environment_is_empty_but_path():
    res, _ = run("import os", ["assert set(os.environ) <= {'PATH', 'LC_CTYPE'}, sorted(os.environ)"])
    assert res.passed, res


def test_evaluator_keeps_working_after_hostile_programs_run_concurrently(sentinel):
    hostile = [
        Program("while True:\n    pass", ["assert True"]),
        Program("import os\nwhile True:\n    os.fork()", ["assert True"]),
        Program("x = bytearray(10 * 1024 ** 3)", ["assert True"]),
        Program(f"import os\nos.remove({str(sentinel)!r})", ["assert True"]),
        Program("import sys\nsys.exit(0)", ["assert False"]),
        Program("import os\nos.kill(os.getppid(), 9)", ["assert True"]),
        Program("import socket\nsocket.socket().connect(('127.0.0.1', 9))", ["assert True"]),
    ]
    good = [Program(f"def f():\n    return {i}", [f"assert f() == {i}"]) for i in range(6)]
    wrong = [Program(f"def f():\n    return {i}", [f"assert f() == {i + 1}"]) for i in range(3)]
    jobs = hostile + good + wrong
    results = run_many(jobs, timeout_s=T, workers=4)
    assert [r.passed for r in results] == [False] * len(hostile) + [True] * len(good) + [False] * len(wrong)
    assert results[0].status == "timeout"
    assert run_many([]) == []


def test_run_many_accepts_tuples_and_keeps_order():
    results = run_many([("a = 1", ["assert a == 1"]), ("a = 2", ["assert a == 1"], ""), ("a = 3", ["assert a == 3"])],
                       workers=2)
    assert [r.passed for r in results] == [True, False, True]


def test_without_namespaces_the_guards_still_hold(monkeypatch, sentinel):
    # where `unshare` is refused (no CAP_SYS_ADMIN), the in-process guards and rlimits are what is left
    import headedit.tasks.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_unshare_prefix", lambda euid: ())
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        jobs = [
            Program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", ["assert True"]),
            Program(f"import _socket\n_socket.socket().connect(('127.0.0.1', {port}))", ["assert True"]),
            Program("import os\nwhile True:\n    os.fork()", ["assert True"]),
            Program(f"import os\nos.remove({str(sentinel)!r})", ["assert True"]),
            Program("import os\nos.kill(os.getppid(), 9)", ["assert True"]),
            Program("x = 2", ["assert x == 2"]),
        ]
        results = run_many(jobs, timeout_s=T, workers=3)
        assert [r.passed for r in results] == [False] * 5 + [True]
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
