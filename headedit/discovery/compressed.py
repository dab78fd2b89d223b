"""Compressed-sensing screen: random multi-head knockouts plus a sparse linear fit.

Each knockout set zeroes a few percent of all heads; a Lasso of the change in the discovery objective
(accuracy in points, or a continuous objective's mean: far less noisy at small n) on the knockout indicators recovers each head's effect from fewer evaluations than one per head when
few heads matter. Positive coefficients are CEL candidates; negative ones are heads the task needs.
"""
from __future__ import annotations

import warnings

import numpy as np

from headedit.discovery.objective import describe, scale, unit
from headedit.discovery.scorer import Scorer
from headedit.discovery.table import ScreenResult
from headedit.events import HeadScored, Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.model.heads import Head, HeadLayout, format_heads

STAGE = "screen:compressed"


def knockout_size(total_heads: int, fraction: float) -> int:
    return int(min(max(1, round(fraction * total_heads)), max(1, total_heads - 1)))


def knockout_sets(layout: HeadLayout, count: int, fraction: float, seed: int) -> list[tuple[Head, ...]]:
    """`count` knockout sets over every head of the model (see `knockout_draws`)."""
    return knockout_draws(layout.all_heads(), count, fraction, seed)


def knockout_draws(heads: list[Head], count: int, fraction: float, seed: int) -> list[tuple[Head, ...]]:
    """`count` sets of ~fraction*heads of `heads`; stratified so every head is in the same number of sets (+-1).

    Heads are drawn from a stream of independent random permutations cut into consecutive groups,
    so coverage is balanced by construction rather than by chance.
    """
    q = knockout_size(len(heads), fraction)
    rng = np.random.default_rng(seed)
    stream: list[Head] = []
    sets: list[tuple[Head, ...]] = []
    while len(sets) < count:
        while len(stream) < q:
            stream.extend(heads[i] for i in rng.permutation(len(heads)))
        group, stream = stream[:q], stream[q:]
        sets.append(tuple(sorted(set(group))))
    return sets


def compressed_screen(
    scorer: Scorer,
    layout: HeadLayout,
    count: int,
    fraction: float,
    seed: int = 0,
    reporter: Reporter = null_reporter,
) -> ScreenResult:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LassoCV

    sets = knockout_sets(layout, count, fraction, seed)
    reporter(StageStarted(STAGE, total=len(sets), description=f"compressed screen ({len(sets)} knockout sets)"))
    scorer.ensure([()], stage=STAGE)
    intact_acc = scorer.accuracy(())
    intact_obj = scorer.mean(())
    factor = scale(scorer.objective)
    chunk = scorer.sets_per_call
    for i in range(0, len(sets), chunk):
        scorer.ensure(sets[i: i + chunk], stage=STAGE)
        reporter(StageProgress(STAGE, min(i + chunk, len(sets)), len(sets)))
    index = {h: j for j, h in enumerate(layout.all_heads())}
    x = np.zeros((len(sets), len(index)))  # [set, head] knockout indicators
    y = np.zeros(len(sets))  # [set] change of the mean objective, in its unit
    for row, hs in enumerate(sets):
        for h in hs:
            x[row, index[h]] = 1.0
        y[row] = factor * (scorer.mean(hs) - intact_obj)
    folds = max(2, min(5, len(sets)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = LassoCV(cv=folds, max_iter=20_000).fit(x, y)
    delta = [[0.0] * layout.num_heads for _ in range(layout.num_layers)]  # [layer, head]; heads a layer lacks: 0
    for h, j in index.items():
        delta[h.layer][h.head] = float(fit.coef_[j])
    for h in layout.all_heads():
        reporter(HeadScored(STAGE, h.layer, h.head, delta[h.layer][h.head]))
    coverage = x.sum(axis=0)
    unique = len({format_heads(s) for s in sets})
    q = knockout_size(len(index), fraction)
    rule = (
        f"{len(sets)} random knockout sets of {q} heads ({fraction:.1%} of {len(index)}), stratified so every head is "
        f"in {int(coverage.min())}-{int(coverage.max())} sets (seed {seed}); LassoCV ({folds}-fold) of the change in "
        f"the mean {describe(scorer.objective)} ({unit(scorer.objective)}) on the knockout indicators; delta = "
        "coefficient = predicted change from zeroing the head alone; positive = CEL candidate, negative = head the "
        "task needs"
    )
    result = ScreenResult(
        method="compressed", rule=rule, num_layers=layout.num_layers, num_heads=layout.num_heads,
        intact_acc=intact_acc, delta=delta, evaluations=unique, unit=f"{unit(scorer.objective)} (predicted)",
        extra={"n": scorer.n, "objective": scorer.objective, "sets": len(sets), "knockout_size": q, "lasso_alpha": float(fit.alpha_),
               "intercept": float(fit.intercept_), "seed": seed,
               "example_evaluations": unique * scorer.n},
    )
    positive = sum(1 for row in delta for v in row if v > 0)
    reporter(StageFinished(STAGE, f"{unique} knockout sets evaluated, {positive} heads with positive coefficients"))
    return result
