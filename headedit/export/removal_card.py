"""The model card's account of a removal (`discovery.direction = "remove"`, headedit/pipeline/selectivity.py):
it states plainly that the edit removes a capability, which tasks were retained and how far they moved against
the tolerance, and the selectivity figure; everything else on the card is the improving card's."""
from __future__ import annotations

from typing import Any, Mapping

from headedit.export.card_metadata import ci_text, pts

REMOVE = "remove"  # headedit.discovery.direction.REMOVE (the card reads validation.json, not the recipe)


def selectivity_line(validation: Mapping[str, Any]) -> str:
    """The selectivity figure in words: the target's drop against the largest retain-task drop ('' when the
    run improves a task)."""
    s = validation.get("selectivity")
    if validation.get("direction") != REMOVE or not isinstance(s, dict):
        return ""
    head = f"selectivity: {s['target']} fell {s['target_drop_points']:.1f} points"
    largest = s.get("largest_retain_drop_points")
    if largest is None:
        return f"{head}; no retain task was measured"
    if largest > 0:
        return f"{head}; largest retain-task drop {largest:.1f} points ({s['largest_retain_drop_task']})"
    return f"{head}; no retain task fell ({s['largest_retain_drop_task']} changed {-largest:+.1f} points)"


def card_section(validation: Mapping[str, Any]) -> dict[str, Any] | None:
    """The card's "Capability removed" section (None for an improving run): what was removed, the retain tasks,
    how far each moved against the tolerance, and the selectivity figure."""
    if validation.get("direction") != REMOVE:
        return None
    task = str(validation.get("task", "the task"))
    tolerance = validation.get("retain_tolerance_points")
    rows = [r for r in validation.get("side_tasks") or [] if isinstance(r, dict) and r.get("retain")]
    passed = validation.get("passed") is True
    statement = (
        f"This edit **removes a capability**: the heads were chosen because zeroing them makes the model fail at "
        f"{task} (held-out accuracy {_pct(validation.get('intact_acc'))} -> {_pct(validation.get('edited_acc'))}, "
        f"{pts(validation.get('gain_points'))} points, 95% CI {ci_text(validation.get('ci95_points'))}), while the "
        f"retained tasks were required to stay within {tolerance} accuracy points of the intact model."
        + ("" if passed else " **Validation did not pass** (see the verdict); this export was forced.")
    )
    retained = [{"task": str(r.get("task")), "intact": _pct(r.get("intact_acc")), "edited": _pct(r.get("edited_acc")),
                 "change": pts(r.get("gain_points")), "ci": ci_text(r.get("ci95_points")), "n": str(r.get("n")),
                 "within": "yes" if r.get("within_tolerance") else "**no**"} for r in rows]
    return {"statement": statement, "retained": retained, "tolerance": tolerance,
            "selectivity": _sentence(selectivity_line(validation))}


def card_limitations(validation: Mapping[str, Any], side: list[dict[str, Any]]) -> list[str] | None:
    """The card's limitations for a removal (None: the improving card's own)."""
    if validation.get("direction") != REMOVE:
        return None
    lines = [f"The removal is measured on {validation.get('task')} only ({pts(validation.get('gain_points'))} points "
             f"on n={validation.get('n')} held-out examples). Zeroing heads removes what those heads compute; "
             "related skills the tasks here do not probe may remain, and the capability may be recoverable by "
             "fine-tuning. Do not treat this as a safety guarantee."]
    for s in side:
        label = "retained" if s.get("retain") else "side task"
        lines.append(f"{s.get('task')} ({label}): {_pct(s.get('intact_acc'))} -> {_pct(s.get('edited_acc'))} "
                     f"({pts(s.get('gain_points'))} points, 95% CI {ci_text(s.get('ci95_points'))}, n={s.get('n')}).")
    lines.append("Tasks not listed here were not measured: other capabilities may have changed by an unknown amount.")
    lines.append("Zeroed heads are removed for every input, not just for this task; no weights were trained.")
    return lines


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _pct(x: Any) -> str:
    return f"{100 * float(x):.2f}%" if isinstance(x, (int, float)) else "n/a"


__all__ = ["card_limitations", "card_section", "selectivity_line"]
