"""Run folders: the recipe, the environment, a journal of every evaluation, and the results.

The journal is what makes a run resumable after kill -9: each finished evaluation is committed
to SQLite (atomic, durable) before the next one starts, keyed by (split, canonical head set),
holding the per-example correctness bits of a prefix of the split. A resumed run replays the
same deterministic algorithm and finds every finished evaluation there.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import platform
import shutil
import sqlite3
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from headedit.atomic import sha256_file, write_text_atomic
from headedit.errors import RecipeError, RunError
from headedit.recipe import Recipe, parse_recipe

RUN_FORMAT = 1
JOURNAL_FORMAT = 1

RECIPE_FILE = "recipe.toml"
RUN_FILE = "run.json"
JOURNAL_FILE = "journal.sqlite"
SCREEN_FILE = "screen.json"
SEARCH_FILE = "search.json"
SELECTION_FILE = "selection.json"
VALIDATION_FILE = "validation.json"
LOCK_FILE = "lock"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"{path.name} missing in run {path.parent}", "is this a headedit run folder?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunError(f"{path} is corrupt: {err}", "delete the file to redo that stage, or start a new run") from None


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
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
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


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS evaluations (
    split TEXT NOT NULL, heads TEXT NOT NULL, n INTEGER NOT NULL, correct_bits BLOB NOT NULL,
    stage TEXT NOT NULL, created TEXT NOT NULL, PRIMARY KEY (split, heads));
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pid INTEGER NOT NULL, started TEXT NOT NULL,
    sets_evaluated INTEGER NOT NULL DEFAULT 0, examples_evaluated INTEGER NOT NULL DEFAULT 0);
"""


def extend_entry(old: Entry | None, split: str, heads: str, bits: np.ndarray, stage: str) -> Entry:
    """The entry after storing `bits` (a prefix of the split): `old` itself when it already covers as many
    examples; a longer prefix must agree with `old` on the examples both saw (evaluation is deterministic)."""
    bits = np.asarray(bits, dtype=bool).ravel()
    if old is not None and old.n >= bits.size:
        return old
    if old is not None and not np.array_equal(old.bits, bits[: old.n]):
        raise RunError(f"journal mismatch for {split} {heads!r}: evaluation is not deterministic", "start a new run")
    return Entry(split, heads, int(bits.size), bits, old.stage if old else stage, old.created if old else now())


class Journal:
    """SQLite journal of evaluations. One row per (split, head set): the correctness bits of a prefix.

    Extending a row (more examples of the same split) replaces it in one transaction; every
    write also adds the work done to this process's `sessions` row, so tests can prove a resumed
    run redid nothing.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
            row = self.db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('format', ?)", (str(JOURNAL_FORMAT),))
            elif int(row[0]) > JOURNAL_FORMAT:
                raise RunError(
                    f"journal {self.path} has format {row[0]}, newer than this headedit understands ({JOURNAL_FORMAT})",
                    "upgrade headedit",
                )
            cur = self.db.execute("INSERT INTO sessions (pid, started) VALUES (?, ?)", (os.getpid(), now()))
            self.session = int(cur.lastrowid)
        except sqlite3.DatabaseError as err:
            raise RunError(f"journal {self.path} is corrupt: {err}", "start a new run; the journal cannot be read") from None
        self._cache: dict[tuple[str, str], Entry] = {}
        try:
            for split, heads, n, blob, stage, created in self.db.execute(
                "SELECT split, heads, n, correct_bits, stage, created FROM evaluations"
            ):
                bits = np.unpackbits(np.frombuffer(blob, dtype=np.uint8), count=n).astype(bool)
                self._cache[(split, heads)] = Entry(split, heads, n, bits, stage, created)
        except (sqlite3.DatabaseError, ValueError) as err:
            raise RunError(f"journal {self.path} is corrupt: {err}", "start a new run; the journal cannot be read") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def get(self, split: str, heads: str) -> Entry | None:
        return self._cache.get((split, heads))

    def put(self, split: str, heads: str, bits: np.ndarray, stage: str, new_examples: int) -> Entry:
        """Store the bits of a prefix (replacing a shorter one) and count `new_examples` of work."""
        old = self._cache.get((split, heads))
        entry = extend_entry(old, split, heads, bits, stage)
        if entry is old:
            return old
        blob = np.packbits(bits).tobytes()
        with self.db:  # one transaction: the row and the work counter land together or not at all
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?, ?, ?)",
                (split, heads, entry.n, blob, entry.stage, entry.created),
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
        return (self.path / RECIPE_FILE).read_text(encoding="utf-8")

    def recipe(self) -> Recipe:
        """The recipe this run was created with; it must still validate."""
        try:
            return parse_recipe(self.recipe_text, self.file(RECIPE_FILE))
        except RecipeError as err:
            raise RunError(f"run {self.path}: its recipe.toml no longer validates: {err.message}",
                           err.hint or "start a new run") from None

    def selection(self) -> dict[str, Any]:
        """selection.json: the selected head set and its discovery scores (a run without one is refused)."""
        if not self.has(SELECTION_FILE):
            raise RunError(f"run {self.path} has no selection yet",
                           f"finish discovery first: headedit discover --resume {self.path}")
        record = self.read(SELECTION_FILE)
        if not isinstance(record, dict):
            raise RunError(f"{self.file(SELECTION_FILE)} is not a JSON object", "delete it and resume the run")
        return record

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def read(self, name: str) -> Any:
        return read_json(self.path / name)

    def write(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)

    def update_info(self, **fields: Any) -> None:
        self.info.update(fields)
        write_json(self.path / RUN_FILE, self.info)

    def journal(self) -> Journal:
        return Journal(self.path / JOURNAL_FILE)

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
            record = {"format": RUN_FORMAT, **info}
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
        info = read_json(path / RUN_FILE)
        fmt = info.get("format") if isinstance(info, dict) else None
        if not isinstance(fmt, int):
            raise RunError(f"{path / RUN_FILE} has no format number", "the run folder is corrupt; start a new run")
        if fmt > RUN_FORMAT:
            raise RunError(f"run {path} has format {fmt}, newer than this headedit understands ({RUN_FORMAT})",
                           "upgrade headedit to work on this run")
        return cls(path, info)


def default_run_dir(name: str, root: Path | None = None) -> Path:
    """runs/<name>-<UTC timestamp>, unique."""
    root = Path(root) if root is not None else Path("runs")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
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
