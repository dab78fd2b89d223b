"""Scores of one batch under one ablation set, their single transfer to the host, and their reduction to
per-example correctness; plus the cuts that keep batches aligned across calls."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from headedit.engine.batch import Batch
from headedit.tasks.base import Example, Task


@dataclass
class RawScores:
    """Per gather of one batch under one ablation set: log-probability of the target and the argmax token.

    Filled on the device during a call and moved to the host once at its end (`to_host`), so the inner loop
    of forwards never waits for the device.
    """

    logprob: np.ndarray | torch.Tensor  # [n_gathers] float64
    argmax: np.ndarray | torch.Tensor  # [n_gathers] int64


def to_host(scores: Iterable[RawScores]) -> None:
    """Replace device tensors by numpy arrays, with one transfer (one host sync) for all of them."""
    pending = [sc for sc in scores if isinstance(sc.logprob, torch.Tensor)]
    if not pending:
        return
    sizes = [int(sc.logprob.numel()) for sc in pending]
    lp = torch.cat([sc.logprob for sc in pending]).cpu().numpy()
    am = torch.cat([sc.argmax for sc in pending]).cpu().numpy()
    at = 0
    for sc, n in zip(pending, sizes):
        sc.logprob, sc.argmax = lp[at:at + n], am[at:at + n]
        at += n


def reduce_scores(task: Task, examples: Sequence[Example], batch: Batch, sc: RawScores, out: np.ndarray) -> None:
    """Per-example correctness of one batch into `out`: exact match needs every target token to be the argmax;
    choices compare summed (optionally byte-length normalised) log-probabilities."""
    tok = batch.gather_tok_host
    if task.kind == "exact":
        ok: dict[int, bool] = {m: True for m in batch.members}
        for i, m in enumerate(batch.gather_member):
            if sc.argmax[i] != tok[i]:
                ok[m] = False
        for m, v in ok.items():
            out[m] = v
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
