"""A seccomp filter for the bubblewrap sandbox: no new user namespaces, no foreign syscall ABIs.

As root the sandbox runs under a throwaway uid without a user namespace of its own, so bwrap's
`--disable-userns` does not apply; a program could still create user namespaces (it gains nothing outside them,
but they widen the kernel surface it can reach). This classic-BPF program, handed to `bwrap --seccomp FD`, makes
`unshare`/`clone` with CLONE_NEWUSER fail with EPERM, `clone3` (whose flags BPF cannot read) fail with ENOSYS so
libc falls back to `clone`, and refuses every syscall of another ABI (i386 `int 0x80`, x32) with ENOSYS.
"""
from __future__ import annotations

import platform
import struct

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
