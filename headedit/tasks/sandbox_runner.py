"""The program that runs inside the sandbox (stdlib only: the parent passes this file's text to `python -I -c`).

It reads one JSON job on stdin and writes one JSON line to the descriptor that was stdout at start (the program's
own output goes to stderr). Two kinds of job:
- "program": run the model's code, the setup and the tests' plain statements, then evaluate each assert's
  *leaves* (the parts that mention the program's names, e.g. `f(3)` in `assert f(3) == 9`) and report their
  values. It decides nothing: the parent, or a "check" job, compares the values with the assert's other parts,
  which never enter this process. Everything this process writes may be forged by the program; a forged report
  can only claim leaf values, which is what a program returning those values would get anyway.
- "check": no model code; evaluate assert templates on leaf values decoded from a program job's report.

The codec is shared with the parent: `decode` builds only None/bool/int/float/complex/str/bytes/bytearray/list/
tuple/set/frozenset/dict/range, so comparing decoded values runs no code the program wrote.
"""
import json
import numbers
import os
import sys
from typing import Callable, NoReturn

MAX_DEPTH = 64  # nesting of a reported value
MAX_REPORT = 4 * 1024 * 1024  # bytes of one report
LEAF = "__headedit_leaf__"  # the name templates call to fetch leaf i
TRUSTED_MODULES = ("math", "cmath", "sys", "string", "re", "collections", "itertools", "operator", "fractions",
                   "decimal")


_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, set, frozenset, dict,
                                  range, type(None))}


class Unencodable(Exception):
    """A leaf value that cannot travel as plain data (a user-defined object, an iterator, a function)."""


def encode(value: object, depth: int = 0) -> object:
    """Tagged JSON: lists stay arrays, other containers become one-key objects; exact base-type data only."""
    if depth > MAX_DEPTH:
        raise Unencodable(f"a value nested deeper than {MAX_DEPTH} levels")
    if value is None or value is True or value is False:
        return value
    t = type(value)
    if t is int or t is float or t is str:
        return value
    d = depth + 1
    # Subclasses travel as their base type's data (their own __eq__ never runs outside).
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [encode(x, d) for x in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [encode(x, d) for x in tuple.__iter__(value)]}
    if isinstance(value, frozenset):
        return {"fs": [encode(x, d) for x in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"s": [encode(x, d) for x in set.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[encode(k, d), encode(v, d)] for k, v in dict.items(value)]}
    if isinstance(value, bytes):
        return {"b": bytes.hex(value)}
    if isinstance(value, bytearray):
        return {"ba": bytearray.hex(value)}
    if isinstance(value, complex):
        return {"c": [complex.__complex__(value).real, complex.__complex__(value).imag]}
    if isinstance(value, range):  # range cannot be subclassed
        return {"r": [value.start, value.stop, value.step]}
    if isinstance(value, type) and t is type and value in _TYPES.values():
        return {"ty": value.__name__}
    # Other numbers (numpy scalars, Fraction) travel as the plain number they convert to, as `==` would see them.
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise Unencodable(f"a value of type {t.__name__}")


def _items(payload: object, depth: int) -> list:
    if type(payload) is not list:
        raise ValueError("a tagged value's payload is not a list")
    return [decode(x, depth + 1) for x in payload]


def decode(obj: object, depth: int = 0) -> object:
    """The inverse of `encode` on parsed JSON; ValueError/TypeError on anything else (e.g. an unhashable key)."""
    if depth > MAX_DEPTH + 2:
        raise ValueError("a value nested too deeply")
    t = type(obj)
    if obj is None or t is bool or t is int or t is float or t is str:
        return obj
    if t is list:
        return _items(obj, depth)
    if not isinstance(obj, dict) or t is not dict or len(obj) != 1:
        raise ValueError("not a tagged value")
    (tag, payload), = obj.items()
    if tag == "t":
        return tuple(_items(payload, depth))
    if tag == "s":
        return set(_items(payload, depth))
    if tag == "fs":
        return frozenset(_items(payload, depth))
    if tag == "d":
        pairs = _items(payload, depth)
        if not all(type(p) is list and len(p) == 2 for p in pairs):
            raise ValueError("a dict entry is not a [key, value] pair")
        return dict(pairs)
    if tag in ("b", "ba") and type(payload) is str:
        data = bytes.fromhex(payload)
        return data if tag == "b" else bytearray(data)
    if tag == "c" and type(payload) is list and len(payload) == 2 and all(type(x) in (int, float) for x in payload):
        return complex(payload[0], payload[1])
    if tag == "r" and type(payload) is list and len(payload) == 3 and all(type(x) is int for x in payload):
        return range(*payload)
    if tag == "ty" and payload in _TYPES:
        return _TYPES[payload]
    raise ValueError(f"unknown tag {tag!r}")


def describe(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {str(err)[:300]}".rstrip(": ")
    except BaseException:
        return type(err).__name__


def _main() -> None:
    raw = b""
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        raw += chunk
    job = json.loads(raw)
    del raw
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.dup(1)  # not inheritable: children the program starts do not get it
    os.dup2(2, 1)  # the program's prints go to the size-limited log, never to the report
    write, _exit = os.write, os._exit

    def report(text):
        data = text.encode("utf-8", "backslashreplace")
        if len(data) > MAX_REPORT:
            data = json.dumps({"failed": f"the test values are too large to report ({len(data)} bytes)"}).encode()
        while data:
            data = data[write(out, data):]

    import resource
    import signal
    mb = 1024 * 1024
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails with EFBIG instead of killing us

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
    if job["count_own_tasks"]:  # weak mode without root: the count is per real uid, so leave room for what runs
        me = os.getuid()
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and os.stat("/proc/" + p).st_uid == me:
                    nproc += len(os.listdir(f"/proc/{p}/task"))
            except OSError:
                pass
    limit(resource.RLIMIT_NPROC, nproc)
    if job["weak_uid"] is not None:
        _drop_keeping_read(job["weak_uid"], report, _exit)
    import ctypes
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (bwrap has set it already)
    if job["expect_no_caps"]:
        with open("/proc/self/status") as fh:
            caps = [line.split()[1] for line in fh if line.startswith("Cap")]
        if len(caps) != 5 or any(int(c, 16) for c in caps) or os.getuid() == 0:
            report(json.dumps({"error": f"the sandbox kept privileges (uid {os.getuid()}, caps {caps})"}))
            _exit(3)
    limit(resource.RLIMIT_AS, job["memory_mb"] * mb)

    class _Timeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise _Timeout()
    signal.signal(signal.SIGALRM, on_alarm)
    setitimer, ITIMER_REAL = signal.setitimer, signal.ITIMER_REAL
    check = job["kind"] == "check"
    sys.path.extend(job["sys_path"])
    if not check:
        _guard()
    # Re-arm every 0.1 s so a program that swallows one timeout still gets the next.
    setitimer(ITIMER_REAL, float(job["timeout_s"]), 0.1)
    try:
        text = _check(job) if check else _program(job, _Timeout)
        setitimer(ITIMER_REAL, 0)
        report(text)
    except _Timeout:
        setitimer(ITIMER_REAL, 0)
        report('{"timeout": true}')
    except BaseException as err:
        setitimer(ITIMER_REAL, 0)
        report(json.dumps({"failed": describe(err)}))
    _exit(0)


def _program(job: dict, timeout_type: type[BaseException]) -> str:
    """Run code, setup and plain test statements; report every leaf's value or exception, in order."""
    dumps = json.dumps
    ns: dict = {}  # empty globals, as HF code_eval does
    for name, src in (("<program>", job["code"]), ("<setup>", job["setup"])):
        exec(compile(src, name, "exec"), ns)
    steps = []
    for i, (kind, body) in enumerate(job["steps"]):
        if kind == "exec":
            exec(compile(body, f"<test {i + 1}>", "exec"), ns)
            continue
        leaves = []
        for src in body:
            try:
                value = eval(compile(src, f"<test {i + 1}>", "eval"), ns)
                leaves.append('{"ok":' + dumps(encode(value)) + "}")
            except timeout_type:
                raise
            except Unencodable as err:
                leaves.append(dumps({"err": f"{err} cannot be compared outside the program's process"}))
            except Exception as err:
                leaves.append(dumps({"err": describe(err)}))
        steps.append("[" + ",".join(leaves) + "]")
    return '{"steps":[' + ",".join(steps) + "]}"


def _check(job: dict) -> str:
    """Evaluate each template on decoded leaf values: True, or the reason it is not."""
    import builtins
    import importlib
    env: dict[str, object] = {"__builtins__": builtins}
    for name in TRUSTED_MODULES:
        env[name] = importlib.import_module(name)
    verdicts = []
    for item in job["asserts"]:
        leaves = item["leaves"]

        def leaf(i: int, leaves: list = leaves) -> object:
            entry = leaves[i]
            if "err" in entry:
                raise _LeafError(entry["err"])
            return decode(entry["ok"])
        env[LEAF] = leaf
        try:
            ok = bool(eval(compile(item["template"], "<assert>", "eval"), env))
            verdicts.append([ok, ""])
        except _LeafError as err:
            verdicts.append([False, str(err)])
        except Exception as err:
            verdicts.append([False, describe(err)])
    return json.dumps({"verdicts": verdicts})


class _LeafError(Exception):
    pass


def _drop_keeping_read(uid: int, report: Callable[[str], None], _exit: Callable[[int], NoReturn]) -> None:
    """Weak mode as root: a throwaway uid keeping only CAP_DAC_READ_SEARCH (to import a stdlib under /root)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS: keep the permitted set across setresuid
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)

    class Hdr(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
    data = (Data * 2)()
    data[0].effective = data[0].permitted = 1 << 2  # CAP_DAC_READ_SEARCH
    if libc.capset(ctypes.byref(Hdr(0x20080522, 0)), data) != 0:
        report(json.dumps({"error": "capset failed"}))
        _exit(3)


def _guard() -> None:
    """Python-level guards, as OpenAI human-eval's `reliability_guard`: they turn common accidents into readable
    errors. They are no security boundary (ctypes, `_io`, `posix` pass them); the namespaces and uids are."""
    import _socket
    import builtins
    import shutil
    import signal
    import socket
    import subprocess
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
    import io
    builtins.open = io.open = guarded_open
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
                 "setuid", "seteuid", "setreuid", "setresuid", "setgid", "setsid", "setpgid",
                 "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown", "chroot", "chdir", "fchdir",
                 "pidfd_open"):
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
        sys.modules[name] = None  # type: ignore[assignment]  # None in sys.modules makes the import fail


if __name__ == "__main__":
    _main()
