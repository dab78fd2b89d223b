"""Journaled scoring of head sets: the only way discovery stages evaluate anything.

Stages ask for "the correctness bits of these sets on the first `upto` examples"; the scorer
answers from the journal when it can and evaluates only the missing examples, in calls of at
most `sets_per_call` sets, committing each call to the journal before the next. That is what
makes re-trying a set free and a killed run resumable without redoing finished work.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable, Sequence

import numpy as np

from headedit.errors import RunError
from headedit.events import Reporter, SetEvaluated, null_reporter
from headedit.model.heads import Head, format_heads
from headedit.runs import Journal

# (head sets, first example, end example) -> bool array [len(sets), end - first]
EvalFn = Callable[[list[tuple[Head, ...]], int, int], np.ndarray]


class Cancelled(RunError):
    """The user cancelled; every finished evaluation is in the journal."""


def _key(heads: Iterable[Head]) -> str:
    return format_heads(heads)


class Scorer:
    """Evaluate head sets on one split through the journal."""

    def __init__(
        self,
        journal: Journal,
        split: str,
        n: int,
        eval_fn: EvalFn,
        reporter: Reporter = null_reporter,
        sets_per_call: int = 16,
        cancel: threading.Event | None = None,
    ) -> None:
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
    def known(self, heads: Iterable[Head]) -> int:
        entry = self.journal.get(self.split, _key(heads))
        return entry.n if entry else 0

    def bits(self, heads: Iterable[Head], upto: int | None = None) -> np.ndarray:
        upto = self.n if upto is None else upto
        entry = self.journal.get(self.split, _key(heads))
        if entry is None or entry.n < upto:
            raise KeyError(f"{_key(heads)!r} not evaluated on {upto} {self.split} examples")
        return entry.bits[:upto]

    def accuracy(self, heads: Iterable[Head]) -> float:
        return float(self.bits(tuple(heads)).mean()) if self.n else 0.0

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
        result = np.asarray(self.eval_fn(batch, start, upto), dtype=bool)
        if result.shape != (len(batch), upto - start):
            raise RuntimeError(f"evaluator returned shape {result.shape}, expected {(len(batch), upto - start)}")
        for hs, row in zip(batch, result):  # row: [upto - start]
            key = _key(hs)
            old = self.journal.get(self.split, key)
            prefix = old.bits[:start] if old is not None else np.zeros(0, dtype=bool)
            self.journal.put(self.split, key, np.concatenate([prefix, row]), stage, new_examples=upto - start)
            self.sets_evaluated += 1
            self.examples_evaluated += upto - start
            if upto == self.n:
                self.reporter(SetEvaluated(stage, key, float(np.concatenate([prefix, row]).mean()), self.n))
        if self.on_work is not None:
            self.on_work(len(batch) * (upto - start))
