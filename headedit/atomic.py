"""Files and folders that appear whole or not at all (temp sibling, fsync, rename): the one atomic writer."""
from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from headedit.errors import ExportError, OutputExistsError


def sha256_file(path: Path, chunk: int = 8 * 2**20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def umask() -> int:
    """The process umask, read without changing it where Linux allows (set-and-restore races other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _umask_modes(folder: Path) -> None:
    """Folders 0777 and files 0666 less the umask (0755/0644 usually): mkdtemp makes 0700, mkstemp and
    safetensors 0600, copies keep their source's mode; an output is as readable as anything else the user makes."""
    mask = umask()
    os.chmod(folder, 0o777 & ~mask)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, rename: a reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600: give the file the mode any new file gets
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def check_target(out: Path, force: bool = False, protect: tuple[Path, ...] = ()) -> Path:
    """The absolute output path, after every check that needs no writing: not the file-system root, the current
    folder or one of its parents, not overlapping `protect`, not a file, resolvable (no symlink loop), an existing
    folder only with `force`, and a writable place to create it."""
    out = Path(os.path.abspath(out))  # "." and "x/.." become real names (a temp sibling of "." would be "..tmp-")
    try:
        cwd = Path.cwd()
        resolved = out.resolve()
        overlaps = [folder for folder in protect if _inside(out, folder) or _inside(folder, out)]
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop on Python < 3.13
        raise OutputExistsError(f"output path {out} cannot be resolved ({getattr(err, 'strerror', None) or err})",
                                "choose another --out") from None
    if out.parent == out or resolved.parent == resolved:
        raise OutputExistsError(f"output {out} is the file-system root", "choose a new folder for the output")
    if cwd == resolved or cwd.is_relative_to(resolved):
        raise OutputExistsError(f"output {out} is the current folder or contains it",
                                "choose a new folder for the output, e.g. --out exports/edited")
    if overlaps:
        raise OutputExistsError(f"output {out} overlaps the source model folder {overlaps[0]}",
                                "choose an output folder outside the source")
    try:
        info = os.stat(out)
    except FileNotFoundError:
        info = None
    except OSError as err:
        raise OutputExistsError(f"output path {out} cannot be used ({err.strerror or err})", "choose another --out") from None
    if info is not None:
        if not stat.S_ISDIR(info.st_mode):
            raise OutputExistsError(f"output {out} exists and is a file, not a folder", "choose another --out")
        if not force:
            raise OutputExistsError(f"output folder {out} already exists", "choose another --out or pass --force")
    ancestor = out.parent
    while not ancestor.exists() and ancestor.parent != ancestor:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputExistsError(f"output {out} lies under {ancestor}, which is a file", "choose another --out")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputExistsError(f"cannot write in {ancestor} (read-only or permission denied)",
                                "choose a writable --out folder")
    return out


@contextmanager
def writer_lock(out: Path) -> Iterator[None]:
    """Exclusive lock beside `out` (`.NAME.lock`) for a whole write: a second writer of the same output, --force
    included, fails at once with one line naming the holder. flock dies with its holder, so kill -9 leaves no
    stale lock; the file is removed at the end while still locked, and a waiter that locked a removed file
    retries on the new one (the inode check)."""
    path = out.parent / f".{out.name}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputExistsError(f"another headedit process (pid {holder}) is writing {out} right now",
                                    "wait for it to finish, or choose another --out") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(fd)


@contextmanager
def atomic_dir(out: Path, force: bool = False, protect: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a temporary folder beside `out`; on success it replaces `out` in one rename.

    `protect` lists folders (the source model) that must never be overwritten or written into. One writer per
    output at a time (`writer_lock`); the checks of `check_target` are repeated once the lock is held, so a
    second writer never replaces what the first just wrote unless it was given --force after the first ended.
    On any error the temporary folder is removed and `out` is left as it was.
    """
    out = check_target(out, force, protect)
    with _own_errors(out):
        out.parent.mkdir(parents=True, exist_ok=True)
    with writer_lock(out):
        check_target(out, force, protect)
        _remove_stale(out)
        with _own_errors(out):
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
        try:
            yield tmp
            with _own_errors(out):
                _umask_modes(tmp)
                if out.exists():
                    trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
                    os.replace(out, trash / "old")
                    os.replace(tmp, out)
                    shutil.rmtree(trash, ignore_errors=True)
                else:
                    os.replace(tmp, out)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if _disk_full(err):
                raise ExportError(f"disk full while writing {out}; nothing was left there", "free space and retry") from None
            raise


@contextmanager
def _own_errors(out: Path) -> Iterator[None]:
    """atomic_dir's own file-system calls: a read-only or forbidden place is one line, not an OSError."""
    try:
        yield
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.ELOOP, errno.EEXIST):
            raise ExportError(f"cannot write {out} ({err.strerror or err})", "choose a writable --out folder") from None
        raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(out: Path) -> None:
    """Delete hidden folders beside `out` left by a writer that was killed (kill -9, power loss).

    A half-written `.tmp-` folder of a dead process is garbage. A `.old-` folder holds the previous export
    and is deleted only when `out` exists (the replacement finished); otherwise it is the only copy, kept.
    """
    for path in out.parent.glob(f".{glob.escape(out.name)}.*-*-*"):
        kind, _, rest = path.name[len(out.name) + 2:].partition("-")
        pid = rest.split("-", 1)[0]
        if kind not in ("tmp", "old") or not pid.isdigit() or _alive(int(pid)):
            continue
        if kind == "tmp" or out.exists():
            shutil.rmtree(path, ignore_errors=True)


def _disk_full(err: BaseException) -> bool:
    """ENOSPC from Python I/O, or from safetensors' Rust writer (which reports it only in its message)."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    text = str(err)
    return "No space left on device" in text or "os error 28" in text
