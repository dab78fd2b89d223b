"""Journaled scoring of head sets: the only way discovery stages evaluate anything.

Stages ask for "the correctness bits (or the objective's values) of these sets on the first `upto`
examples"; the scorer answers from the journal when it can and evaluates only the missing examples, in
calls of at most `sets_per_call` sets, committing each call to the journal before the next. That is what
makes re-trying a set free and a killed run resumable without redoing finished work.

With a continuous objective (`headedit.discovery.objective`) the evaluator returns (bits, values) and both are
journaled; a row from an older journal without values counts as unseen and is evaluated again.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from headedit.discovery.objective import OBJECTIVES
from headedit.errors import RunError
from headedit.events import Reporter, SetEvaluated, null_reporter
from headedit.journal import Entry
from headedit.model.heads import Head, format_heads

# (head sets, first example, end example) -> bool array [len(sets), end - first], or with a continuous
# objective (bits, float values), both [len(sets), end - first]
EvalFn = Callable[[list[tuple[Head, ...]], int, int], "np.ndarray | tuple[np.ndarray, np.ndarray]"]


class ScoreJournal(Protocol):
    """What a scorer needs of its journal: the run's `headedit.journal.Journal`, or a rank's in-memory
    `headedit.pipeline.parallel.MirrorJournal` (same rows, no SQLite)."""

    def get(self, split: str, heads: str) -> Entry | None: ...

    def put(self, split: str, heads: str, bits: np.ndarray, stage: str, new_examples: int,
            values: np.ndarray | None = None) -> Entry: ...


class Cancelled(RunError):
    """The user cancelled; every finished evaluation is in the journal."""


def _key(heads: Iterable[Head]) -> str:
    return format_heads(heads)


class Scorer:
    """Evaluate head sets on one split through the journal."""

    def __init__(
        self,
        journal: ScoreJournal,
        split: str,
        n: int,
        eval_fn: EvalFn,
        reporter: Reporter = null_reporter,
        sets_per_call: int = 16,
        cancel: threading.Event | None = None,
        objective: str = "accuracy",
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}")
        self.objective = objective
        self.journal = journal
        self.split = split
        self.n = n
        self.eval_fn = eval_fn
        self.reporter = reporter
        self.sets_per_call = max(1, sets_per_call)
        self.cancel = cancel
        self.sets_evaluated = 0  # evaluation calls' rows done by this process
        self.examples_evaluated = 0  # (set, example) pairs done by this process
        self.on_work: Callable[[int], None] | None = None  # called with (set x example) pairs after each call

    # ---- lookups ------------------------------------------------------------------------
    @property
    def continuous(self) -> bool:
        return self.objective != "accuracy"

    def known(self, heads: Iterable[Head]) -> int:
        entry = self.journal.get(self.split, _key(heads))
        if entry is None or (self.continuous and entry.values is None):
            return 0
        return entry.n

    def bits(self, heads: Iterable[Head], upto: int | None = None) -> np.ndarray:
        upto = self.n if upto is None else upto
        entry = self.journal.get(self.split, _key(heads))
        if entry is None or entry.n < upto:
            raise KeyError(f"{_key(heads)!r} not evaluated on {upto} {self.split} examples")
        return entry.bits[:upto]

    def values(self, heads: Iterable[Head], upto: int | None = None) -> np.ndarray:
        """float64 [upto]: the objective per example (the bits as 0/1 for accuracy)."""
        upto = self.n if upto is None else upto
        entry = self.journal.get(self.split, _key(heads))
        if entry is None or entry.n < upto or (self.continuous and entry.values is None):
            raise KeyError(f"{_key(heads)!r} not evaluated on {upto} {self.split} examples")
        if not self.continuous:
            return entry.bits[:upto].astype(np.float64)
        assert entry.values is not None
        return entry.values[:upto].astype(np.float64)

    def accuracy(self, heads: Iterable[Head]) -> float:
        return float(self.bits(tuple(heads)).mean()) if self.n else 0.0

    def mean(self, heads: Iterable[Head], upto: int | None = None) -> float:
        """Mean objective on the first `upto` examples (the whole split by default)."""
        v = self.values(tuple(heads), upto)
        return float(v.mean()) if v.size else 0.0

    # ---- evaluation ---------------------------------------------------------------------
    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("run cancelled; every finished evaluation is saved", "resume with `headedit discover --resume RUN`")

    def ensure(self, head_sets: Sequence[Iterable[Head]], upto: int | None = None, stage: str = "") -> list[np.ndarray]:
        """Bits of every set on examples [0, upto), evaluating only what the journal lacks."""
        upto = self.n if upto is None else min(upto, self.n)
        sets = [tuple(sorted(set(Head(*h) for h in hs))) for hs in head_sets]
        missing: dict[int, list[tuple[Head, ...]]] = {}  # start example -> sets
        seen: set[str] = set()
        for hs in sets:
            key = _key(hs)
            if key in seen:
                continue
            seen.add(key)
            have = self.known(hs)
            if have < upto:
                missing.setdefault(have, []).append(hs)
            elif upto == self.n:
                self.reporter(SetEvaluated(stage, key, self.accuracy(hs), self.n, cached=True))
        for start in sorted(missing):
            group = missing[start]
            for i in range(0, len(group), self.sets_per_call):
                self.check_cancel()
                batch = group[i: i + self.sets_per_call]
                self._evaluate(batch, start, upto, stage)
        return [self.bits(hs, upto) for hs in sets]

    def _evaluate(self, batch: list[tuple[Head, ...]], start: int, upto: int, stage: str) -> None:
        out = self.eval_fn(batch, start, upto)
        if isinstance(out, tuple):
            result, values = np.asarray(out[0], dtype=bool), np.asarray(out[1], dtype=np.float32)
        elif self.continuous:
            raise RuntimeError(f"the {self.objective} objective needs an evaluator that returns (bits, values)")
        else:
            result, values = np.asarray(out, dtype=bool), None
        if result.shape != (len(batch), upto - start) or (values is not None and values.shape != result.shape):
            raise RuntimeError(f"evaluator returned shape {result.shape}, expected {(len(batch), upto - start)}")
        for i, (hs, row) in enumerate(zip(batch, result)):  # row: [upto - start]
            key = _key(hs)
            old = self.journal.get(self.split, key)
            prefix = old.bits[:start] if old is not None else np.zeros(0, dtype=bool)
            full_values = None
            if self.continuous and values is not None:
                before = old.values[:start] if old is not None and old.values is not None else np.zeros(0, np.float32)
                full_values = np.concatenate([before, values[i]])  # start > 0 only where the journal had values
            self.journal.put(self.split, key, np.concatenate([prefix, row]), stage, new_examples=upto - start,
                             values=full_values)
            self.sets_evaluated += 1
            self.examples_evaluated += upto - start
            if upto == self.n:
                self.reporter(SetEvaluated(stage, key, float(np.concatenate([prefix, row]).mean()), self.n))
        if self.on_work is not None:
            self.on_work(len(batch) * (upto - start))
