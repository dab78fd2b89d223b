"""The journal of a run: every finished evaluation, committed to SQLite before the next one starts.

Keyed by (split, canonical head set), each row holds the per-example correctness bits of a prefix of the split
and (format 2) the discovery objective's per-example values, so a run killed at any point resumes by replaying the
same deterministic algorithm and finding every finished evaluation here. Rows are shape-checked on reading.
"""
from __future__ import annotations

import datetime as _dt
import os
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from headedit.errors import RunError
from headedit.run_schema import (
    check_row,
)

JOURNAL_FORMAT = 2  # 2: per-example objective values (format-1 journals are upgraded in place)

def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


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


