"""Scores of one batch under one ablation set, their single transfer to the host, and their reduction to
per-example correctness and the continuous discovery objective (`headedit.discovery.objective`); plus the cuts
that keep batches aligned across calls."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence, cast

import numpy as np
import torch

from headedit.engine.batch import Batch
from headedit.tasks.base import Example, Task


@dataclass
class RawScores:
    """Per gather of one batch under one ablation set: log-probability of the target, the argmax token and the
    best log-probability of any other token (for the exact-match margin; None when not computed).

    Filled on the device during a call and moved to the host once at its end (`to_host`), so the inner loop
    of forwards never waits for the device.
    """

    logprob: np.ndarray | torch.Tensor  # [n_gathers] float64
    argmax: np.ndarray | torch.Tensor  # [n_gathers] int64
    other: np.ndarray | torch.Tensor | None = None  # [n_gathers] float64


def to_host(scores: Iterable[RawScores]) -> None:
    """Replace device tensors by numpy arrays, with one transfer (one host sync) for all of them."""
    pending = [sc for sc in scores if isinstance(sc.logprob, torch.Tensor)]
    if not pending:
        return
    sizes = [int(cast(torch.Tensor, sc.logprob).numel()) for sc in pending]
    lp = torch.cat([cast(torch.Tensor, sc.logprob) for sc in pending]).cpu().numpy()
    am = torch.cat([cast(torch.Tensor, sc.argmax) for sc in pending]).cpu().numpy()  # set with logprob
    with_other = all(isinstance(sc.other, torch.Tensor) for sc in pending)
    ot = torch.cat([sc.other for sc in pending]).cpu().numpy() if with_other else None  # type: ignore[misc]
    at = 0
    for sc, n in zip(pending, sizes):
        sc.logprob, sc.argmax = lp[at:at + n], am[at:at + n]
        if ot is not None:
            sc.other = ot[at:at + n]
        at += n


def reduce_scores(task: Task, examples: Sequence[Example], batch: Batch, sc: RawScores, out: np.ndarray,
                  values: np.ndarray | None = None, objective: str = "accuracy") -> None:
    """Per-example correctness of one batch into `out` (and, given `values`, the objective): exact match needs
    every target token to be the argmax; choices compare summed (optionally byte-length normalised)
    log-probabilities. Objectives are defined in `headedit.discovery.objective`."""
    tok = batch.gather_tok_host
    assert tok is not None  # make_batches always sets it
    if task.kind == "exact":
        ok: dict[int, bool] = {m: True for m in batch.members}
        margin: dict[int, float] = {}
        total: dict[int, float] = defaultdict(float)
        for i, m in enumerate(batch.gather_member):
            if sc.argmax[i] != tok[i]:
                ok[m] = False
            total[m] += float(sc.logprob[i])
            if values is not None and objective == "margin":
                if sc.other is None:
                    raise ValueError("the exact-match margin needs the best other token's log-probability")
                gap = float(sc.logprob[i]) - float(sc.other[i])
                margin[m] = min(margin.get(m, gap), gap)
        for m, v in ok.items():
            out[m] = v
            if values is not None:
                values[m] = float(v) if objective == "accuracy" else \
                    (margin.get(m, 0.0) if objective == "margin" else total[m])
        return
    totals: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for i, m in enumerate(batch.gather_member):
        totals[m][batch.gather_group[i]] += float(sc.logprob[i])
    for m in batch.members:
        ex = examples[m]
        scores = [totals[m][k] for k in range(len(ex.choices))]
        if task.length_normalize:
            lengths = ex.meta.get("choice_lengths") or [len(c.encode("utf-8")) for c in ex.choices]
            scores = [s / max(1, n) for s, n in zip(scores, lengths)]
        out[m] = int(np.argmax(scores)) == ex.label
        if values is not None:
            values[m] = choice_value(scores, int(ex.label or 0), objective)


def choice_value(scores: Sequence[float], label: int, objective: str) -> float:
    """The objective of one choice example from its per-choice scores (see `headedit.discovery.objective`)."""
    if objective == "accuracy":
        return float(int(np.argmax(scores)) == label)
    s = np.asarray(scores, dtype=np.float64)
    if objective == "margin":
        wrong = np.delete(s, label)
        return float(s[label] - wrong.max()) if wrong.size else 0.0
    top = s.max()
    return float(s[label] - top - np.log(np.exp(s - top).sum()))


def aligned_spans(n: int, offset: int, block: int | None, doubling: bool = False) -> list[tuple[int, int]] | None:
    """[a, b) ranges of a call's examples that never straddle a cut in split coordinates: the multiples of
    `block`, or with `doubling` the points block, 2*block, 4*block, ..."""
    if not block or block <= 0:
        return None
    if doubling:
        marks, k = [], block
        while k < offset + n:
            if k > offset:
                marks.append(k - offset)
            k *= 2
    else:
        marks = [k * block - offset for k in range(offset // block + 1, (offset + n - 1) // block + 1)]
    cuts = [0] + marks + [n]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
