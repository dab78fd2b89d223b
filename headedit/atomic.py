"""Files and folders that appear whole or not at all (temp sibling, fsync, rename): the one atomic writer."""
from __future__ import annotations

import errno
import glob
import hashlib
import os
import shutil
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


@contextmanager
def atomic_dir(out: Path, force: bool = False, protect: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a temporary folder beside `out`; on success it replaces `out` in one rename.

    `protect` lists folders (the source model) that must never be overwritten or written into.
    On any error the temporary folder is removed and `out` is left as it was.
    """
    out = Path(out)
    for folder in protect:
        if _inside(out, folder) or _inside(folder, out):
            raise OutputExistsError(
                f"output {out} overlaps the source model folder {folder}", "choose an output folder outside the source"
            )
    if out.exists() and not force:
        raise OutputExistsError(f"output folder {out} already exists", "choose another --out or pass --force")
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
        yield tmp
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
