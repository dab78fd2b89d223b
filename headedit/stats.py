"""Paired statistics for intact-vs-edited correctness on the same examples.

Every figure headedit reports compares two boolean vectors over the same examples, so the
statistics are paired: the bootstrap resamples examples (not the two arms separately) and
McNemar's exact test looks only at the discordant examples.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# Smallest p-value reported; below it every output says "p < 1e-300" (a float64 cannot go much lower).
P_FLOOR = 1e-300


def _pair(intact: Sequence[bool] | np.ndarray, edited: Sequence[bool] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(intact, dtype=bool).ravel()
    b = np.asarray(edited, dtype=bool).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired statistics need equal lengths, got {a.size} and {b.size}")
    return a, b


def discordant(intact: Sequence[bool] | np.ndarray, edited: Sequence[bool] | np.ndarray) -> tuple[int, int]:
    """(fixed, broken): examples the edit turned right, and examples it turned wrong."""
    a, b = _pair(intact, edited)
    return int(np.count_nonzero(~a & b)), int(np.count_nonzero(a & ~b))


def gain_points(intact: Sequence[bool] | np.ndarray, edited: Sequence[bool] | np.ndarray) -> float:
    a, b = _pair(intact, edited)
    if a.size == 0:
        return 0.0
    return float(100.0 * (b.mean() - a.mean()))


def paired_bootstrap_ci(
    intact: Sequence[bool] | np.ndarray,
    edited: Sequence[bool] | np.ndarray,
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the gain in points, resampling examples as pairs.

    A pair's difference is -1, 0 or +1, so resampling n pairs is a multinomial draw over those
    three outcomes: exact same distribution as index resampling, O(n_boot) instead of O(n_boot*n).
    """
    a, b = _pair(intact, edited)
    n = a.size
    if n == 0:
        return (0.0, 0.0)
    fixed, broken = discordant(a, b)
    probs = np.array([broken, n - fixed - broken, fixed], dtype=np.float64) / n
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, probs, size=n_boot)  # [boot, outcome(-1, 0, +1)]
    gains = 100.0 * (counts[:, 2] - counts[:, 0]) / n
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(gains, [tail, 1.0 - tail])
    return (float(lo), float(hi))


def _log_binom_pmf(k: int, n: int) -> float:
    """log P(X = k) for X ~ Binomial(n, 1/2)."""
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0)


def _log_sum_exp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def binom_tail_at_least(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), computed in log space so tiny tails stay accurate."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return math.exp(_log_sum_exp([_log_binom_pmf(i, n) for i in range(k, n + 1)]))


def mcnemar_exact(intact: Sequence[bool] | np.ndarray, edited: Sequence[bool] | np.ndarray) -> float:
    """Two-sided exact McNemar p-value: a binomial test on the discordant pairs, floored at P_FLOOR."""
    fixed, broken = discordant(intact, edited)
    n = fixed + broken
    if n == 0:
        return 1.0
    k = max(fixed, broken)
    p = 2.0 * binom_tail_at_least(k, n)
    return float(min(1.0, max(p, P_FLOOR)))


def sign_test_worse(fixed: int, broken: int) -> float:
    """One-sided exact p-value that an edit is worse: P(X >= broken) with X ~ Bin(fixed+broken, 1/2)."""
    return binom_tail_at_least(broken, fixed + broken)


def wilson_interval(correct: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of an accuracy, as fractions (well-behaved near 0 and 1, unlike Wald)."""
    if n <= 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def relative_error_reduction(intact_acc: float, edited_acc: float) -> float | None:
    """Share of the intact model's errors the edit removed: gain / (1 - intact); None when intact is perfect."""
    if intact_acc >= 1.0:
        return None
    return float((edited_acc - intact_acc) / (1.0 - intact_acc))


def format_p(p: float) -> str:
    """`p < 1e-300` at the floor, else `p=1.2e-05` / `p=0.0123`: one spelling for CLI, TUI and card."""
    if p <= P_FLOOR:
        return "p < 1e-300"
    if p < 1e-4:
        return f"p={p:.1e}"
    return f"p={p:.3g}"


def paired_summary(
    intact: Sequence[bool] | np.ndarray,
    edited: Sequence[bool] | np.ndarray,
    seed: int = 0,
    n_boot: int = 10_000,
    level: float = 0.95,
) -> dict:
    """The paper-table numbers for one task: accuracies, gain, error reduction, CI and McNemar."""
    a, b = _pair(intact, edited)
    n = int(a.size)
    intact_acc = float(a.mean()) if n else 0.0
    edited_acc = float(b.mean()) if n else 0.0
    lo, hi = paired_bootstrap_ci(a, b, level=level, n_boot=n_boot, seed=seed)
    rer = relative_error_reduction(intact_acc, edited_acc)
    return {
        "n": n,
        "intact_acc": intact_acc,
        "edited_acc": edited_acc,
        "gain_points": 100.0 * (edited_acc - intact_acc),
        "relative_error_reduction": rer,
        "ci95_points": [lo, hi],
        "mcnemar_p": mcnemar_exact(a, b),
    }


# ---- discovery evidence: one-sided paired tests of "the candidate set beats the current best" -------------
def sign_test_better(better: int, worse: int) -> float:
    """One-sided exact p-value that an edit is better: P(X >= better) with X ~ Bin(better+worse, 1/2).

    On 0/1 outcomes this is the one-sided exact McNemar test (better/worse = fixed/broken examples).
    """
    return binom_tail_at_least(better, better + worse)


def paired_t_greater(diff: Sequence[float] | np.ndarray) -> float:
    """One-sided paired t-test p-value that the mean of `diff` (candidate - reference, per example) is above 0.

    Degenerate cases: fewer than two examples gives 1; zero spread gives P_FLOOR for a positive mean, else 1.
    """
    d = np.asarray(diff, dtype=np.float64).ravel()
    n = d.size
    if n < 2:
        return 1.0
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if not sd > 0.0:
        return P_FLOOR if mean > 0.0 else 1.0
    t = mean / (sd / math.sqrt(n))
    # scipy comes with scikit-learn; imported here to keep CLI start-up light
    from scipy.special import stdtr

    return float(min(1.0, max(float(stdtr(n - 1, -t)), P_FLOOR)))


def sign_flip_greater(diff: Sequence[float] | np.ndarray, n_perm: int = 10_000, seed: int = 0) -> float:
    """One-sided sign-flip permutation p-value that the mean of `diff` is above 0 (seeded Monte Carlo).

    Under the null each per-example difference is symmetric about 0, so flipping signs at random gives the null
    distribution of the mean; p = (1 + #{flipped mean >= observed}) / (1 + n_perm), never below 1/(1 + n_perm).
    """
    d = np.asarray(diff, dtype=np.float64).ravel()
    if d.size == 0:
        return 1.0
    observed = float(d.mean())
    rng = np.random.default_rng(seed)
    hits, done = 0, 0
    block = max(1, min(n_perm, 4_000_000 // d.size))  # flips per chunk, bounding memory at ~32 MB
    while done < n_perm:
        k = min(block, n_perm - done)
        signs = rng.integers(0, 2, size=(k, d.size), dtype=np.int8) * 2 - 1  # [flip, example]
        hits += int(np.count_nonzero(signs @ d / d.size >= observed - 1e-12 * abs(observed)))
        done += k
    return (1 + hits) / (1 + n_perm)


def holm(pvalues: Sequence[float], alpha: float, family: int | None = None) -> list[bool]:
    """Holm's step-down rejections at family-wise level `alpha`.

    `family` is the number of hypotheses the p-values were drawn from (default: as many as given); hypotheses
    that were never tested count as p = 1, which can only remove rejections, so the level still holds.
    Its first step is Bonferroni: the smallest p must be below alpha / family.
    """
    m = max(len(pvalues), int(family or 0))
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] >= alpha / (m - rank):
            break
        out[i] = True
    return out
