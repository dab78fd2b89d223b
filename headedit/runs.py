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
import sqlite3
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from headedit.atomic import sha256_file, write_text_atomic
from headedit.errors import RecipeError, RunError
from headedit.recipe import Recipe, parse_recipe
from headedit.run_schema import (
    CHECKS,
    MAX_RECIPE_BYTES,
    MAX_RUN_FILE_BYTES,
    check_row,
    check_run_info,
    recipe_digest,
)

RUN_FORMAT = 1
JOURNAL_FORMAT = 2  # 2: per-example objective values (format-1 journals are upgraded in place)

RECIPE_FILE = "recipe.toml"
RUN_FILE = "run.json"
JOURNAL_FILE = "journal.sqlite"
SCREEN_FILE = "screen.json"
SEARCH_FILE = "search.json"
SELECTION_FILE = "selection.json"
VALIDATION_FILE = "validation.json"
LOCK_FILE = "lock"


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


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
                from headedit import __version__

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


# ---- journal ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    split: str
    heads: str
    n: int
    bits: np.ndarray  # [n] bool, correctness of examples 0..n-1 of the split
    stage: str
    created: str
    values: np.ndarray | None = None  # [n] float32 discovery objective per example; None = not recorded


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS evaluations (
    split TEXT NOT NULL, heads TEXT NOT NULL, n INTEGER NOT NULL, correct_bits BLOB NOT NULL,
    stage TEXT NOT NULL, created TEXT NOT NULL, objective_values BLOB, PRIMARY KEY (split, heads));
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pid INTEGER NOT NULL, started TEXT NOT NULL,
    sets_evaluated INTEGER NOT NULL DEFAULT 0, examples_evaluated INTEGER NOT NULL DEFAULT 0);
"""


def extend_entry(old: Entry | None, split: str, heads: str, bits: np.ndarray, stage: str,
                 values: np.ndarray | None = None) -> Entry:
    """The entry after storing `bits` (a prefix of the split) and optionally their objective `values`: `old`
    itself when it already covers as many examples (with values, if these come with values); a longer prefix
    must agree with `old` on the examples both saw (evaluation is deterministic). A row recorded without values
    (a format-1 journal) is replaced by one with values, its bits checked the same way."""
    bits = np.asarray(bits, dtype=bool).ravel()
    if values is not None:
        values = np.asarray(values, dtype=np.float32).ravel()
        if values.shape != bits.shape:
            raise ValueError(f"{values.size} objective values for {bits.size} bits")
    upgrade = old is not None and values is not None and old.values is None
    if old is not None and old.n >= bits.size and not upgrade:
        return old
    if old is not None:
        both = min(old.n, bits.size)
        if not np.array_equal(old.bits[:both], bits[:both]):
            raise RunError(f"journal mismatch for {split} {heads!r}: evaluation is not deterministic",
                           "start a new run")
    return Entry(split, heads, int(bits.size), bits, old.stage if old else stage, old.created if old else now(),
                 values)


class Journal:
    """SQLite journal of evaluations. One row per (split, head set): the correctness bits of a prefix, and
    (format 2) the discovery objective's per-example values over the same prefix as a float32 blob.

    Extending a row (more examples of the same split) replaces it in one transaction; every
    write also adds the work done to this process's `sessions` row, so tests can prove a resumed
    run redid nothing.
    """

    def __init__(self, path: Path, recipe_sha256: str | None = None) -> None:
        """Open (or create) the journal. Its meta format and every row are checked before anything is written;
        with `recipe_sha256` (a run's pinned recipe) a journal written under another recipe is refused."""
        self.path = Path(path)
        self._cache: dict[tuple[str, str], Entry] = {}
        with self._errors("open"):
            self.db = sqlite3.connect(self.path, isolation_level=None)
        try:
            self._open(recipe_sha256)
        except BaseException:
            self.db.close()  # the last connection: sqlite removes the -wal/-shm files a read made
            raise

    def _open(self, recipe_sha256: str | None) -> None:
        with self._errors("open"):
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)  # CREATE ... IF NOT EXISTS: writes only into a new, empty journal
            meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
            fmt = meta.get("format")
            if fmt is not None and (not isinstance(fmt, str) or not fmt.isdigit() or len(fmt) > 6):
                raise RunError(f"journal {self.path} has format {str(fmt)[:20]!r}, not a format number",
                               "start a new run; the journal cannot be read")
            if fmt is not None and int(fmt) > JOURNAL_FORMAT:
                raise RunError(
                    f"journal {self.path} has format {fmt}, newer than this headedit understands ({JOURNAL_FORMAT})",
                    "upgrade headedit",
                )
            pinned = meta.get("recipe_sha256")
            if recipe_sha256 is not None and pinned is not None and pinned != recipe_sha256:
                raise RunError(f"journal {self.path} was written under another recipe than the run's recipe.toml",
                               "put the run's original recipe.toml back, or start a new run with the changed recipe")
            columns = {r[1] for r in self.db.execute("PRAGMA table_info(evaluations)")}
            values_column = "objective_values" if "objective_values" in columns else "NULL"
            for split, heads, n, blob, stage, created, vblob in self.db.execute(
                f"SELECT split, heads, n, correct_bits, stage, created, {values_column} FROM evaluations"
            ):
                check_row(self.path, split, heads, n, blob, stage, created, vblob)
                bits = np.unpackbits(np.frombuffer(blob, dtype=np.uint8), count=n).astype(bool)
                values = None if vblob is None else np.frombuffer(vblob, dtype="<f4", count=n).astype(np.float32)
                self._cache[(split, heads)] = Entry(split, heads, n, bits, stage, created, values)
            # everything read is valid: now write (WAL mode, format, recipe pin, this session's row)
            self.db.execute("PRAGMA journal_mode=WAL")
            if fmt is None:
                self.db.execute("INSERT INTO meta VALUES ('format', ?)", (str(JOURNAL_FORMAT),))
            elif int(fmt) < JOURNAL_FORMAT:
                self._upgrade()
            if recipe_sha256 is not None and pinned is None:
                self.db.execute("INSERT INTO meta VALUES ('recipe_sha256', ?)", (recipe_sha256,))
            cur = self.db.execute("INSERT INTO sessions (pid, started) VALUES (?, ?)", (os.getpid(), now()))
            assert cur.lastrowid is not None  # set by the INSERT just run
            self.session = int(cur.lastrowid)

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """SQLite failures as one RunError line, by SQLite's own error code: a full disk (SQLITE_FULL, or an I/O error
        on a file system with no space left) and a read-only or unopenable folder are said so, and the journal is
        called corrupt only when SQLite says it is (SQLITE_CORRUPT, SQLITE_NOTADB)."""
        try:
            yield
        except sqlite3.DatabaseError as err:
            name = str(getattr(err, "sqlite_errorname", "") or "")
            text = str(err)
            if name == "SQLITE_FULL" or (name.startswith("SQLITE_IOERR") and self._disk_nearly_full()):
                raise RunError(f"disk full while {'writing' if doing == 'write' else 'opening'} the journal "
                               f"{self.path}; finished evaluations are kept", "free space, then run the same command "
                               "again") from None
            if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM")):
                raise RunError(f"cannot write the journal {self.path} ({text})",
                               "make the run folder writable, then run the same command again") from None
            if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or not name:
                raise RunError(f"journal {self.path} is corrupt: {text}",
                               "start a new run; the journal cannot be read") from None
            raise RunError(f"could not {'write' if doing == 'write' else 'open'} the journal {self.path} ({text})",
                           "check the disk, then run the same command again; finished evaluations are kept") from None

    def _disk_nearly_full(self) -> bool:
        try:
            fs = os.statvfs(self.path.parent)
        except OSError:
            return False
        return fs.f_bavail * fs.f_frsize < 1 * 2**20

    def _upgrade(self) -> None:
        """Format 1 -> 2: add the objective column (old rows keep NULL: bits only), in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            columns = {r[1] for r in self.db.execute("PRAGMA table_info(evaluations)")}
            if "objective_values" not in columns:
                self.db.execute("ALTER TABLE evaluations ADD COLUMN objective_values BLOB")
            self.db.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(JOURNAL_FORMAT),))

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def get(self, split: str, heads: str) -> Entry | None:
        return self._cache.get((split, heads))

    def put(self, split: str, heads: str, bits: np.ndarray, stage: str, new_examples: int,
            values: np.ndarray | None = None) -> Entry:
        """Store the bits of a prefix (replacing a shorter one), optionally with their objective values (float32),
        and count `new_examples` of work."""
        old = self._cache.get((split, heads))
        entry = extend_entry(old, split, heads, bits, stage, values)
        if entry is old:
            return old
        blob = np.packbits(entry.bits).tobytes()
        vblob = None if entry.values is None else entry.values.astype("<f4").tobytes()
        with self._errors("write"), self.db:  # one transaction: the row and the work counter land together or not
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT OR REPLACE INTO evaluations (split, heads, n, correct_bits, stage, created, objective_values) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (split, heads, entry.n, blob, entry.stage, entry.created, vblob),
            )
            self.db.execute(
                "UPDATE sessions SET sets_evaluated = sets_evaluated + 1, examples_evaluated = examples_evaluated + ? "
                "WHERE id = ?",
                (int(new_examples), self.session),
            )
        self._cache[(split, heads)] = entry
        return entry

    def entries(self, split: str | None = None) -> list[Entry]:
        return [e for e in self._cache.values() if split is None or e.split == split]

    def sessions(self) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT id, pid, started, sets_evaluated, examples_evaluated FROM sessions ORDER BY id")
        return [dict(zip(("id", "pid", "started", "sets_evaluated", "examples_evaluated"), r)) for r in rows]

    def splits_used(self) -> set[str]:
        return {split for split, _ in self._cache}


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
