"""Read-only views of a run's journal.sqlite, for comparing runs and counting work."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Union

Row = tuple


def journal_rows(run: Path, *, stage: bool = False, values: bool = False) -> dict[tuple[str, str], Row]:
    """{(split, heads): (n, packed bits[, stage][, values bytes])} through the Journal API."""
    from headedit.journal import Journal

    with Journal(run / "journal.sqlite") as journal:
        rows: dict[tuple[str, str], Row] = {}
        for e in journal.entries():
            row: tuple[Union[int, bytes, str, None], ...] = (e.n, e.bits.tobytes())
            if stage:
                row += (e.stage,)
            if values:
                row += (None if e.values is None else e.values.tobytes(),)
            rows[(e.split, e.heads)] = row
        return rows


def _read_only(run: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{run / 'journal.sqlite'}?mode=ro", uri=True)


def journal_totals(run: Path) -> tuple[int, int]:
    """(examples committed as work by all sessions, examples held by all rows), read without writing."""
    db = _read_only(run)
    try:
        work = db.execute("SELECT COALESCE(SUM(examples_evaluated), 0) FROM sessions").fetchone()[0]
        held = db.execute("SELECT COALESCE(SUM(n), 0) FROM evaluations").fetchone()[0]
    finally:
        db.close()
    return int(work), int(held)


def journal_work(run: Path) -> int:
    """Examples committed as work by all sessions; 0 while the journal does not exist or is mid-checkpoint."""
    try:
        return journal_totals(run)[0]
    except sqlite3.Error:
        return 0


def evaluations(run: Path, where: str = "1") -> int:
    """Journal rows matching the SQL condition `where` (0 while the journal does not exist or is mid-write)."""
    try:
        db = _read_only(run)
        try:
            return int(db.execute(f"SELECT COUNT(*) FROM evaluations WHERE {where}").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def search_rows(run: Path) -> int:
    """Evaluations the search stage has committed (0 before the journal exists)."""
    return evaluations(run, "stage = 'search'")


def journal_arrays(run: Path) -> dict[tuple[str, str], tuple]:
    """{(split, heads): (bits array, values array or None)}, for prefix and closeness checks."""
    from headedit.journal import Journal

    with Journal(run / "journal.sqlite") as journal:
        return {(e.split, e.heads): (e.bits.copy(), None if e.values is None else e.values.copy())
                for e in journal.entries()}
