"""The bubblewrap command line of the sandbox: filesystem layout, privileges, and a seccomp filter.

The layout is an allowlist: /usr, /lib*, the Python installation and the evaluator's site-packages, all
read-only; a fresh /proc, a minimal /dev and a private size-limited tmpfs /tmp as the only writable place. As root,
setpriv switches to a throwaway uid with every capability dropped; without root, bwrap's own user namespace.

Seccomp: as root the sandbox runs under a throwaway uid without a user namespace of its own, so bwrap's
`--disable-userns` does not apply; a program could still create user namespaces (it gains nothing outside them,
but they widen the kernel surface it can reach). This classic-BPF program, handed to `bwrap --seccomp FD`, makes
`unshare`/`clone` with CLONE_NEWUSER fail with EPERM, `clone3` (whose flags BPF cannot read) fail with ENOSYS so
libc falls back to `clone`, and refuses every syscall of another ABI (i386 `int 0x80`, x32) with ENOSYS.
"""
from __future__ import annotations

import os
import platform
import shutil
import site
import struct
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

TMPFS_MB = 64  # the private /tmp

# (AUDIT_ARCH, unshare, clone, clone3) for the machines we know; elsewhere no filter is used.
_ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}
CLONE_NEWUSER = 0x10000000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}


def seccomp_program() -> bytes | None:
    """The filter as bytes for `bwrap --seccomp`, or None on an architecture not listed above."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, unshare, clone, clone3 = arch
    # Offsets in struct seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low 32 bits on little endian).
    return b"".join([
        _ins(_LD_W_ABS, 4),                      # 0: A = arch
        _ins(_JEQ, audit_arch, 1, 0),            # 1: native ABI? go to 3
        _ins(_RET, _ERRNO | ENOSYS),             # 2: any other ABI: ENOSYS
        _ins(_LD_W_ABS, 0),                      # 3: A = syscall number
        _ins(_JGE, 0x40000000, 0, 1),            # 4: x32 syscall numbers on x86_64
        _ins(_RET, _ERRNO | ENOSYS),             # 5
        _ins(_JEQ, clone3, 0, 1),                # 6: clone3: flags unreadable here
        _ins(_RET, _ERRNO | ENOSYS),             # 7
        _ins(_JEQ, unshare, 1, 0),               # 8: unshare -> 10
        _ins(_JEQ, clone, 0, 3),                 # 9: clone -> 10, else allow (13)
        _ins(_LD_W_ABS, 16),                     # 10: A = flags (args[0], low half)
        _ins(_JSET, CLONE_NEWUSER, 0, 1),        # 11: asks for a user namespace?
        _ins(_RET, _ERRNO | EPERM),              # 12
        _ins(_RET, _ALLOW),                      # 13
    ])


def python_path() -> str:
    """The base interpreter (a venv's python is a link to it; `-I` ignores the venv anyway)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def site_paths() -> list[str]:
    """The evaluator's site-packages, put on the program's sys.path as lm-eval's in-process exec would see them
    (the interpreter runs with -S: no .pth files run, start-up is 4x faster)."""
    return [os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)]


@lru_cache(maxsize=1)
def _bwrap_options() -> frozenset[str]:
    """The options this bwrap knows: --size (0.7) and --disable-userns (0.8) are used only where present."""
    try:
        done = subprocess.run([shutil.which("bwrap") or "bwrap", "--help"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(w for w in (done.stdout + done.stderr).split() if w.startswith("--"))


@lru_cache(maxsize=1)
def _layout() -> tuple[str, ...]:
    """bwrap arguments for the filesystem: read-only /usr, /lib*, Python and its site-packages; private /tmp."""
    args = ["--ro-bind", "/usr", "/usr"]
    bound = ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
            bound.append(top)
    made: set[str] = set()
    for path in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python_path()), *site_paths()):
        real = os.path.realpath(path)
        if any(real == b or real.startswith(b + "/") for b in bound):
            continue
        parents = [p for p in Path(real).parents if str(p) != "/"]
        for parent in reversed(parents):  # bwrap would create them 0700: the throwaway uid must pass through
            if str(parent) not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += ["--ro-bind", real, real]
        bound.append(real)
    if os.path.isfile("/etc/ld.so.cache"):
        args += ["--perms", "0755", "--dir", "/etc", "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    size = ["--size", str(TMPFS_MB * 1024 * 1024)] if "--size" in _bwrap_options() else []
    return (*args, "--proc", "/proc", "--dev", "/dev", *size, "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp")


def open_seccomp(folder: Path) -> int | None:
    """A read-only descriptor on the seccomp filter (sandbox_seccomp.py), None where there is no filter."""
    program = seccomp_program()
    if program is None:
        return None
    (folder / "seccomp.bpf").write_bytes(program)
    return os.open(folder / "seccomp.bpf", os.O_RDONLY)


def bwrap_argv(uid: int | None, seccomp_fd: int | None) -> list[str]:
    """The bubblewrap command in front of the interpreter; `uid` is the throwaway uid when we are root."""
    bwrap = shutil.which("bwrap") or "bwrap"
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", *_layout(),
            *seccomp, "--cap-drop", "ALL"]
    if uid is None:  # no root: bwrap's own user namespace, and none nested inside it
        nested = ["--disable-userns"] if "--disable-userns" in _bwrap_options() else []
        return [argv[0], "--unshare-user", *nested, *argv[1:], "--"]
    setpriv = shutil.which("setpriv") or "setpriv"
    # setpriv needs these three to switch uid and empty the bounding set; the switch to a non-zero uid then
    # clears the permitted, effective and ambient sets, and --inh-caps the inheritable one.
    return argv + ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--",
                   setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                   "--bounding-set=-all", "--"]
