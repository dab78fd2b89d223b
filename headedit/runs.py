"""Run folders: the recipe, the environment, a journal of every evaluation, and the results.

The journal is what makes a run resumable after kill -9: each finished evaluation is committed
to SQLite (atomic, durable) before the next one starts, keyed by (split, canonical head set),
holding the per-example correctness bits of a prefix of the split. A resumed run replays the
same deterministic algorithm and finds every finished evaluation there.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import platform
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from headedit.atomic import sha256_file, write_text_atomic
from headedit.errors import RecipeError, RunError
from headedit.journal import Entry, Journal, extend_entry, now
from headedit.recipe import Recipe, parse_recipe
from headedit.run_schema import (
    CHECKS,
    MAX_RECIPE_BYTES,
    MAX_RUN_FILE_BYTES,
    check_run_info,
    recipe_digest,
)

RUN_FORMAT = 1

RECIPE_FILE = "recipe.toml"
RUN_FILE = "run.json"
JOURNAL_FILE = "journal.sqlite"
SCREEN_FILE = "screen.json"
SEARCH_FILE = "search.json"
SELECTION_FILE = "selection.json"
VALIDATION_FILE = "validation.json"
LOCK_FILE = "lock"




def write_json(path: Path, data: Any) -> None:
    """Atomically; a full disk or a read-only run folder is one RunError line (the old file stays whole)."""
    try:
        write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise RunError(f"disk full while writing {path}; the run is as it was before",
                           "free space, then run the same command again") from None
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise RunError(f"cannot write {path} ({err.strerror})", "make the run folder writable") from None
        raise


def read_bytes_bounded(path: Path, limit: int) -> bytes:
    """A run file's bytes: a regular file of at most `limit` bytes (a FIFO or device is refused unread)."""
    path = Path(path)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise RunError(f"{path} is not a regular file of at most {limit} bytes",
                           "restore the file written by headedit, or start a new run")
        with open(path, "rb") as fh:
            return fh.read(limit + 1)[:limit]
    except FileNotFoundError:
        raise RunError(f"{path.name} missing in run {path.parent}", "is this a headedit run folder?") from None
    except OSError as err:
        raise RunError(f"cannot read {path} ({err.strerror or err})", "check the run folder's permissions") from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(read_bytes_bounded(path, MAX_RUN_FILE_BYTES).decode("utf-8"))
    except (ValueError, RecursionError) as err:
        detail = f": {err}" if isinstance(err, json.JSONDecodeError) else ""
        raise RunError(f"{path} is corrupt{detail}", "delete the file to redo that stage, or start a new run") from None


# ---- environment record -----------------------------------------------------------------------
def environment(device: str | None = None) -> dict[str, str]:
    """Versions that decide the numbers: recorded so a run can be reproduced and compared."""
    from importlib import metadata

    env: dict[str, str] = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("headedit", "torch", "transformers", "numpy", "scikit-learn", "safetensors", "tokenizers", "datasets"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            if pkg == "headedit":
                from headedit import __version__  # lazy: only when headedit runs from an uninstalled tree

                env[pkg] = __version__
    if device is not None:
        env["device"] = str(device)
    return env


def weight_hashes(folder: Path | None) -> dict[str, str]:
    """sha256 of every weight file in a local model folder ({} when the model has no local folder)."""
    if folder is None or not Path(folder).is_dir():
        return {}
    return {p.name: sha256_file(p) for p in sorted(Path(folder).glob("*.safetensors"))}


# ---- lock ---------------------------------------------------------------------------------------
@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Exclusive lock on the run folder: a second process on the same run gets a RunError.

    flock is released by the kernel when the holder dies, so kill -9 never leaves a stale lock.
    """
    path = Path(run_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise RunError(
                f"run {run_dir} is in use by another headedit process (pid {holder})",
                "wait for it to finish or stop it; each run can be worked on by one process at a time",
            ) from None
        try:  # the holder's pid, for the message above; informational, so a full disk does not stop the run here
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            pass
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# ---- run folder ---------------------------------------------------------------------------------
class Run:
    """An opened run folder. Create with `Run.create`, reopen with `Run.open`."""

    def __init__(self, path: Path, info: dict[str, Any]) -> None:
        self.path = Path(path)
        self.info = info

    @property
    def recipe_text(self) -> str:
        try:
            return read_bytes_bounded(self.path / RECIPE_FILE, MAX_RECIPE_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise RunError(f"{self.file(RECIPE_FILE)} is not UTF-8 text", "start a new run") from None

    def recipe(self) -> Recipe:
        """The recipe this run was created with; it must still validate."""
        try:
            recipe = parse_recipe(self.recipe_text, self.file(RECIPE_FILE))
        except RecipeError as err:
            raise RunError(f"run {self.path}: its recipe.toml no longer validates: {err.message}",
                           err.hint or "start a new run") from None
        named = self.info.get("task", {}).get("name")
        if named is not None and named != recipe.task.name:
            raise RunError(f"run {self.path}: run.json names task {named[:60]!r} but recipe.toml runs "
                           f"{recipe.task.name!r}", "the run folder was edited; start a new run")
        return recipe

    def selection(self) -> dict[str, Any]:
        """selection.json: the selected head set and its discovery scores (a run without one is refused)."""
        if not self.has(SELECTION_FILE):
            raise RunError(f"run {self.path} has no selection yet",
                           f"finish discovery first: headedit discover --resume {self.path}")
        return self.read(SELECTION_FILE)  # shape checked: an object with canonical heads

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def read(self, name: str) -> Any:
        """A JSON file of the run, bounded and (for the files headedit writes) checked for its shape."""
        data = read_json(self.path / name)
        check = CHECKS.get(name)
        return check(self.path / name, data) if check is not None else data

    def write(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)

    def update_info(self, **fields: Any) -> None:
        self.info.update(fields)
        write_json(self.path / RUN_FILE, self.info)

    def journal(self) -> Journal:
        """The run's journal, pinned to this run's recipe."""
        return Journal(self.path / JOURNAL_FILE, recipe_digest(self.recipe_text))

    def lock(self):  # -> context manager
        return run_lock(self.path)

    @classmethod
    def create(cls, path: Path, recipe_text: str, info: dict[str, Any]) -> "Run":
        path = Path(path)
        if path.exists() and any(path.iterdir()):
            raise RunError(f"run folder {path} already exists and is not empty",
                           f"resume it with `headedit discover --resume {path}` or choose another --out")
        # Built in a hidden sibling and renamed into place: a crash leaves either no run or a whole one.
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.creating-", dir=path.parent))
        try:
            write_text_atomic(tmp / RECIPE_FILE, recipe_text)
            record = {"format": RUN_FORMAT, **info, "recipe_sha256": recipe_digest(recipe_text)}
            record.setdefault("created", now())
            write_json(tmp / RUN_FILE, record)
            os.rename(tmp, path)  # replaces an empty folder, refuses a non-empty one
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if path.exists() and any(path.iterdir()):
                raise RunError(f"run folder {path} already exists and is not empty",
                               "choose another --out") from None
            raise RunError(f"could not create run folder {path}: {err.strerror or err}",
                           "check that the folder is writable") from None
        return cls(path, record)

    @classmethod
    def open(cls, path: Path) -> "Run":
        path = Path(path)
        if not path.is_dir():
            raise RunError(f"run folder {path} does not exist", "give the folder `headedit discover` created")
        if not (path / RUN_FILE).is_file() or not (path / RECIPE_FILE).is_file():
            raise RunError(f"{path} is not a headedit run folder (no {RUN_FILE} / {RECIPE_FILE})",
                           "give the folder `headedit discover` created")
        info = check_run_info(path / RUN_FILE, read_json(path / RUN_FILE))
        fmt = info["format"]
        if fmt > RUN_FORMAT:
            raise RunError(f"run {path} has format {fmt}, newer than this headedit understands ({RUN_FORMAT})",
                           "upgrade headedit to work on this run")
        run = cls(path, info)
        pinned = info.get("recipe_sha256")
        if pinned is not None and recipe_digest(run.recipe_text) != pinned:
            raise RunError(f"recipe.toml of run {path} was changed after the run was created (its sha256 no longer "
                           "matches run.json)", "put the original recipe back, or start a new run with the changed "
                           "recipe (`headedit discover NEW.toml`)")
        for name in CHECKS:  # every stage file is checked now, before any stage reads or writes the run
            if name != RUN_FILE and run.has(name):
                run.read(name)
        return run


def default_run_dir(name: str, root: Path | None = None) -> Path:
    """runs/<name>-<UTC timestamp>, unique."""
    root = Path(root) if root is not None else Path("runs")
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "run"
    path = root / f"{safe}-{stamp}"
    i = 1
    while path.exists():
        i += 1
        path = root / f"{safe}-{stamp}-{i}"
    return path


__all__ = [
    "RUN_FORMAT", "Journal", "Entry", "extend_entry", "Run", "run_lock", "environment", "weight_hashes", "sha256_file",
    "write_json", "read_json", "default_run_dir", "now",
]
