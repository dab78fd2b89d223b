"""When a search step counts as evidence: a one-sided paired test of the step's best set against the current best.

The test (per discovery example, candidate minus current best):
- accuracy: the exact sign test on the discordant examples (one-sided exact McNemar: fixed vs broken);
- margin / logprob: the paired t-test on the per-example differences of the objective.

Multiplicity: the step's best set was picked among many, and when the screen that chose the candidate pool looked
at the same discovery examples, the family is every set the step could have produced with *any* head as the
addition (greedy: the beam's expansions over all heads; exhaustive: every subset of that size of all heads), not
just the pool. With `discovery.screen_rows` the screen sees other rows than the search, the pool is fixed before
the search's rows are looked at, and the family is only the sets the step tried (the pool's expansions).
Bonferroni over the family (Holm's first step) keeps the chance that pure noise passes a step below `alpha`,
whatever the screen did; the first step, which decides "found" vs "no set found", is exactly controlled (later
steps build on a base set chosen on the same rows, so their level is approximate).

The objective must rise at all; with a continuous objective the step must also not lower discovery accuracy
significantly (one-sided exact sign test at `alpha`, uncorrected: a margin can grow on examples already right
while borderline ones flip wrong, as on the bundled copy demo); and `min_gain` > 0 adds a floor in
discovery-accuracy points over the current best (0, the default, leaves accuracy free otherwise: at small n a
real gain can lose a row by chance).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from headedit.discovery.objective import describe, scale, unit
from headedit.model.heads import Head, format_heads
from headedit.stats import discordant, paired_t_greater, sign_test_better, sign_test_worse


def p_value(objective: str, reference: np.ndarray, candidate: np.ndarray) -> float:
    """One-sided p-value that `candidate` beats `reference` (per-example values; bits as 0/1 for accuracy)."""
    if objective == "accuracy":
        fixed, broken = discordant(reference.astype(bool), candidate.astype(bool))
        return sign_test_better(fixed, broken)
    return paired_t_greater(np.asarray(candidate, np.float64) - np.asarray(reference, np.float64))


def accuracy_drop_p(reference: np.ndarray, candidate: np.ndarray) -> float:
    """One-sided exact sign test that `candidate` is less accurate than `reference` (broken vs fixed examples)."""
    fixed, broken = discordant(reference.astype(bool), candidate.astype(bool))
    return sign_test_worse(fixed, broken)


def describe_test(objective: str) -> str:
    if objective == "accuracy":
        return "one-sided exact sign test on the discordant examples (exact McNemar)"
    return f"one-sided paired t-test on the per-example {objective}"


def greedy_family(beam: Sequence[tuple[Head, ...]], all_heads: Sequence[Head]) -> int:
    """Distinct sets one greedy step could produce: every beam set plus any one head not in it."""
    out: set[tuple[Head, ...]] = set()
    for base in beam:
        for h in all_heads:
            if h not in base:
                out.add(tuple(sorted(base + (h,))))
    return max(1, len(out))


def exhaustive_family(total_heads: int, size: int) -> int:
    """Subsets of `size` heads out of all heads."""
    return max(1, math.comb(total_heads, size))


@dataclass
class Step:
    """One search step's decision, as recorded in search.json."""

    size: int
    best: str  # the step's best set (by mean objective)
    vs: str  # the current best set it was tested against ("" = intact)
    objective_gain: float  # mean objective change vs `vs`, in the objective's unit
    gain_points: float  # discovery-accuracy change vs `vs`, points
    p: float
    family: int
    threshold: float  # alpha / family
    accepted: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def decide(objective: str, alpha: float, min_gain: float, size: int, family: int, best: tuple[Head, ...],
           vs: tuple[Head, ...], best_values: np.ndarray, vs_values: np.ndarray, best_bits: np.ndarray,
           vs_bits: np.ndarray) -> Step:
    """Accept the step's best set only on evidence: strict improvement, p < alpha/family, accuracy floor."""
    n = best_values.size
    obj_gain = scale(objective) * float(best_values.mean() - vs_values.mean()) if n else 0.0
    acc_gain = 100.0 * float(best_bits.mean() - vs_bits.mean()) if n else 0.0
    p = p_value(objective, vs_values, best_values) if n else 1.0
    threshold = alpha / family if alpha < 1.0 else 1.0  # alpha = 1: no test (the legacy "any gain" rule)
    name, against = format_heads(best) or "(none)", format_heads(vs) or "intact"
    shown = f"{obj_gain:+.4g} {unit(objective)}" + ("" if objective == "accuracy" else f" ({acc_gain:+.2f} points)")
    if not obj_gain > 0:
        accepted, why = False, f"the best size-{size} set {name} does not improve the {objective} over {against} ({shown})"
    elif alpha < 1.0 and p >= threshold:
        accepted, why = False, (f"the best size-{size} set {name} gains {shown} over {against}, not significant: "
                                f"p={p:.3g}, needs p < {threshold:.3g} (alpha {alpha:g} / {family} sets it was chosen "
                                "among)")
    elif alpha < 1.0 and objective != "accuracy" and accuracy_drop_p(vs_bits, best_bits) < alpha:
        accepted, why = False, (f"the best size-{size} set {name} raises the {objective} (p={p:.3g}) but lowers "
                                f"discovery accuracy significantly ({acc_gain:+.2f} points, one-sided sign test "
                                f"p={accuracy_drop_p(vs_bits, best_bits):.3g} < {alpha:g})")
    elif min_gain > 0 and acc_gain < min_gain - 1e-9:
        accepted, why = False, (f"the best size-{size} set {name} passes the test (p={p:.3g}) but gains "
                                f"{acc_gain:+.2f} accuracy points over {against}, below min_gain {min_gain:g}")
    else:
        accepted, why = True, f"{name} beats {against}: {shown}, p={p:.3g} < {threshold:.3g}"
    return Step(size, format_heads(best), format_heads(vs), obj_gain, acc_gain, p, family, threshold, accepted, why)


def rule(objective: str, alpha: float, min_gain: float, independent_pool: bool = False) -> str:
    if alpha >= 1.0:
        evidence = "no significance test (alpha = 1)"
    elif independent_pool:
        evidence = (f"{describe_test(objective)} vs the current best set on the search's own rows, at alpha "
                    f"{alpha:g} Bonferroni-corrected over the sets the step tried (the screen chose the candidates "
                    "on other rows)")
    else:
        evidence = (f"{describe_test(objective)} vs the current best set, at alpha {alpha:g} Bonferroni-corrected over "
                    "every set the step could have produced with any head as the addition (the candidate pool was "
                    "chosen on the same examples)")
    guard = ("" if alpha >= 1.0 or objective == "accuracy" else
             f", without lowering discovery accuracy significantly (one-sided exact sign test at {alpha:g})")
    return (f"objective: {describe(objective)}; a step is accepted when its best set raises the objective over the "
            f"current best set and passes {evidence}{guard}"
            + (f", and gains at least {min_gain:g} discovery-accuracy points" if min_gain > 0 else ""))


__all__ = ["Step", "accuracy_drop_p", "decide", "describe_test", "exhaustive_family", "greedy_family", "p_value", "rule"]
