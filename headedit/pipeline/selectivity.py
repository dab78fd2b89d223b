"""Validation, export and card of a removal (`discovery.direction = "remove"`): was the capability removed,
selectively?

Validation measures every task intact -> edited on held-out with the paired bootstrap interval and exact McNemar
(the improving direction's rows); for a removal the verdict passes only when

- the target's drop is real: its change is negative, the interval excludes zero (upper end below 0) and McNemar
  p < validation.alpha; and
- every retain task stays within `discovery.retain_tolerance` points: the low end of its change's interval is at
  or above -tolerance (non-inferiority: the data must show the retain task did not fall further, so a small n
  that cannot show it fails rather than passes by default).

The selectivity figure sets the target's drop against the largest retain-task drop. Export refuses a removal
that did not pass (or was never validated) unless forced, and the card says plainly what was removed, which tasks
were retained and how far they moved.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from headedit.discovery.direction import REMOVE, retain_names
from headedit.export.removal_card import selectivity_line
from headedit.recipe import Recipe
from headedit.stats import format_p


def is_removal(recipe: Recipe) -> bool:
    return recipe.discovery.direction == REMOVE


def validation_task_names(recipe: Recipe) -> list[str]:
    """Tasks validated besides the target: the side tasks, then any retain task not among them."""
    side = list(recipe.validation.side_tasks)
    return side + [name for name in retain_names(recipe) if name not in side]


@dataclass
class Verdict:
    passed: bool
    text: str
    fields: dict[str, Any] = field(default_factory=dict)  # validation.json additions


def removal_verdict(recipe: Recipe, rows: Sequence[dict[str, Any]], alpha: float) -> Verdict | None:
    """The remove direction's verdict from validation's per-task rows (rows[0] = the target); None when the
    recipe improves. Retain rows are marked in place (`retain`, `tolerance_points`, `within_tolerance`)."""
    if not is_removal(recipe):
        return None
    tolerance = recipe.discovery.retain_tolerance
    retain = set(retain_names(recipe))
    main, others = rows[0], rows[1:]
    level = round(100 * (1 - alpha))
    lo, hi = main["ci95_points"]
    change = float(main["gain_points"])
    dropped = change < 0 and hi < 0 and main["mcnemar_p"] < alpha
    kept: list[dict[str, Any]] = []
    for row in others:
        if row["task"] in retain:
            row.update(retain=True, tolerance_points=tolerance, within_tolerance=row["ci95_points"][0] >= -tolerance - 1e-9)
            kept.append(row)
    broken = [r for r in kept if not r["within_tolerance"]]
    worst = max(kept, key=lambda r: (-r["gain_points"], r["task"])) if kept else None
    selectivity = {
        "target": main["task"], "target_drop_points": -change,
        "largest_retain_drop_points": -float(worst["gain_points"]) if worst else None,
        "largest_retain_drop_task": worst["task"] if worst else None,
        "margin_points": -change - max(0.0, -float(worst["gain_points"])) if worst else None,
    }
    numbers = f"{change:+.1f} points, {level}% CI [{lo:.1f}, {hi:.1f}], McNemar {format_p(main['mcnemar_p'])}"
    moves = "; ".join(f"{r['task']} {r['gain_points']:+.1f} points, CI [{r['ci95_points'][0]:.1f}, "
                      f"{r['ci95_points'][1]:.1f}]" for r in kept)
    if not dropped:
        why = "no drop" if change >= 0 else f"not significant at {alpha:g}"
        text = f"removal did not hold on held-out: {main['task']} {numbers} ({why})"
    elif broken:
        names = ", ".join(f"{r['task']} (CI low end {r['ci95_points'][0]:.1f})" for r in broken)
        text = (f"removal not selective: {main['task']} {numbers}, but retained task(s) fell beyond the "
                f"{tolerance:g}-point tolerance: {names}")
    else:
        text = f"removal held on held-out: {main['task']} {numbers}; retained within {tolerance:g} points: {moves}"
    fields = {"direction": REMOVE, "removes": main["task"], "retain": [r["task"] for r in kept],
              "relative_error_reduction": None,  # an error "reduction" means nothing for a removal
              "retain_tolerance_points": tolerance, "selectivity": selectivity,
              "verdict_rule": (f"passes when {main['task']}'s change is negative with its {level}% interval below "
                               f"zero and McNemar p < {alpha:g}, and every retain task's interval low end is at or "
                               f"above -{tolerance:g} points")}
    return Verdict(dropped and not broken, text, fields)


__all__ = ["Verdict", "is_removal", "removal_verdict", "selectivity_line",
           "validation_task_names"]
