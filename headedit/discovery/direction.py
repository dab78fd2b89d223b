"""The remove direction: zero the heads a capability needs, selectively (capability localization).

CEL (`direction = "improve"`) searches for heads whose zeroing raises the target task. `direction = "remove"`
uses the same screens, search and evidence rule on the *negated* target objective, so "improve" there means
"the target falls": `RemovalScorer` is a view of the target's journaled scorer whose values are negated (the
margin's negative; for accuracy the error bit), so the screen ranks heads by how much zeroing them drops the
target, early stop drops heads whose zeroing clearly *helps* it, and a search step is accepted only when its
set's drop over the current best set passes the paired test at `discovery.alpha`, corrected for multiplicity,
exactly as in the improving search.

Selectivity is a constraint, not a penalty: a set is selectable only when every retain task
(`discovery.retain`, default `validation.side_tasks`) loses at most `discovery.retain_tolerance` accuracy points
on its own discovery split (point estimate; `RetainConstraint`). The search checks the constraint lazily, in
rank order, so only the sets it would pick are evaluated on the retain tasks; every retain evaluation is
journaled (split `discovery:retain:<task>`), so a resumed search replays the same choices.

Files keep the task's own sense: screen.json's deltas are the target's drop (positive = zeroing the head removes
more; the heatmap's green), selection.json's accuracies are real accuracies (intact -> edited, a negative gain).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from headedit.discovery.objective import scale, unit
from headedit.discovery.scorer import Scorer
from headedit.discovery.search import Ranked, SearchResult
from headedit.discovery.table import ScreenResult
from headedit.events import Event, HeadScored, Reporter, SetEvaluated
from headedit.model.heads import Head, format_heads
from headedit.stats import paired_bootstrap_ci

IMPROVE, REMOVE = "improve", "remove"
RETAIN_SPLIT = "discovery:retain:"  # journal split of a retain task's discovery rows: + task name
RETAIN_STAGE = "search:retain"


class RemovalScorer(Scorer):
    """The target's scorer seen from the remove direction: per-example values negated (accuracy: the error bit),
    so every stage that maximises the objective maximises the target's drop. A view: it shares the scorer's
    state (journal, counters, progress hook), and the journal keeps the real bits and values."""

    def __init__(self, scorer: Scorer) -> None:  # a view: no Scorer.__init__, the state is the scorer's own
        self.__dict__ = scorer.__dict__

    def bits(self, heads: Iterable[Head], upto: int | None = None) -> np.ndarray:
        return ~super().bits(heads, upto)  # [upto] True = the target answered wrongly

    def values(self, heads: Iterable[Head], upto: int | None = None) -> np.ndarray:
        v = super().values(heads, upto)  # [upto]
        if not self.continuous:
            return 1.0 - v
        # margin: only the margin of examples still answered right counts (-max(m, 0)); an example already wrong
        # cannot be removed further, so making it "more wrong" earns nothing (it would only add heads)
        return -np.maximum(v, 0.0) if self.objective == "margin" else -v

    def ensure(self, head_sets: Sequence[Iterable[Head]], upto: int | None = None, stage: str = "") -> list[np.ndarray]:
        report = self.reporter

        def real(event: Event) -> None:  # a cached set is announced with self.accuracy (the error rate)
            if isinstance(event, SetEvaluated) and event.cached:
                event = replace(event, accuracy=1.0 - event.accuracy)
            report(event)

        self.reporter = real
        try:
            return super().ensure(head_sets, upto, stage)
        finally:
            self.reporter = report


def raw(scorer: Scorer) -> Scorer:
    """The scorer in the task's own sense (a RemovalScorer's underlying view)."""
    return _Raw(scorer) if isinstance(scorer, RemovalScorer) else scorer


class _Raw(Scorer):
    """A plain view of a RemovalScorer's state (undoes the negation for reporting)."""

    def __init__(self, scorer: Scorer) -> None:
        self.__dict__ = scorer.__dict__


@dataclass(frozen=True)
class RetainCheck:
    """How one retain task moved under one head set on its discovery split (accuracy, points)."""

    change: float  # edited minus intact, points (negative = it fell)
    ci: tuple[float, float]  # paired bootstrap interval of the change, points

    def within(self, tolerance: float) -> bool:
        """Non-inferiority: even the interval's low end stays within the tolerance (as validation asks)."""
        return self.ci[0] >= -tolerance - 1e-9


class RetainConstraint:
    """Admit a head set only when every retain task's accuracy stays within `tolerance` points of intact on its
    own discovery split, with evidence: the low end of the change's paired-bootstrap interval (at `level`, the
    level validation uses) must be at or above -tolerance, so discovery admits what validation can confirm.

    `scorers` are the retain tasks' journaled accuracy scorers. Checked lazily in rank order (`admit`), so a
    search step evaluates the retain tasks only on the sets it would pick; the decisions are a pure function
    of the journal's rows (resume-safe)."""

    def __init__(self, scorers: Mapping[str, Scorer], tolerance: float, level: float = 0.95, n_boot: int = 10_000,
                 seed: int = 0) -> None:
        self.scorers = dict(scorers)
        self.tolerance = float(tolerance)
        self.level, self.n_boot, self.seed = level, n_boot, seed
        self.checked: dict[str, dict[str, RetainCheck]] = {}  # head-set text -> {task: check}
        self.order: list[tuple[str, int]] = []  # (set, size) in the order they were checked
        self._intact: dict[str, float] = {}

    def intact(self) -> dict[str, float]:
        """Each retain task's intact discovery accuracy (fraction)."""
        for name, scorer in self.scorers.items():
            if name not in self._intact:
                scorer.ensure([()], stage=RETAIN_STAGE)
                self._intact[name] = scorer.accuracy(())
        return dict(self._intact)

    def checks(self, heads: tuple[Head, ...]) -> dict[str, RetainCheck]:
        """Every retain task's change when `heads` are zeroed."""
        key = format_heads(heads)
        if key not in self.checked:
            self.intact()
            out = {}
            for name, scorer in self.scorers.items():
                scorer.ensure([heads], stage=RETAIN_STAGE)
                a, b = scorer.bits(()), scorer.bits(heads)  # [n] each
                lo, hi = paired_bootstrap_ci(a, b, level=self.level, n_boot=self.n_boot, seed=self.seed)
                out[name] = RetainCheck(100.0 * float(b.mean() - a.mean()) if a.size else 0.0, (lo, hi))
            self.checked[key] = out
            self.order.append((key, len(heads)))
        return self.checked[key]

    def within(self, heads: tuple[Head, ...]) -> bool:
        return all(c.within(self.tolerance) for c in self.checks(heads).values())

    def admit(self, ranked: Ranked, need: int) -> Ranked:
        out: Ranked = []
        for heads, score in ranked:
            if len(out) >= need:
                break
            if self.within(heads):
                out.append((heads, score))
        return out

    def refusal(self, size: int) -> str:
        broken = [k for k, m in self.order if m == size and not self._ok(k)]
        example = ""
        if broken:
            name, c = min(self.checked[broken[0]].items(), key=lambda x: (x[1].ci[0], x[0]))
            example = (f"; the step's best set {broken[0]} moves {name} by {c.change:+.2f} points, interval "
                       f"[{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]")
        return (f"no size-{size} set keeps every retain task within {self.tolerance:g} points of intact on its "
                f"discovery split (low end of the {self.level:.0%} interval at or above -{self.tolerance:g}){example}")

    def _ok(self, key: str) -> bool:
        return all(c.within(self.tolerance) for c in self.checked[key].values())

    def to_json(self) -> dict[str, Any]:
        return {"tasks": list(self.scorers), "tolerance_points": self.tolerance, "level": self.level,
                "rule": (f"a set is admitted when, for every retain task, the low end of the {self.level:.0%} paired "
                         f"bootstrap interval of its discovery-accuracy change is at or above -{self.tolerance:g} "
                         "points"),
                "intact_acc": self.intact(),
                "checked": [{"heads": k, "admitted": self._ok(k),
                             "change_points": {t: c.change for t, c in self.checked[k].items()},
                             "ci_points": {t: list(c.ci) for t, c in self.checked[k].items()}}
                            for k, _ in self.order]}


def label_screen(screen: ScreenResult, target: str) -> ScreenResult:
    """A fresh screen run on a RemovalScorer, labelled in the remove direction's terms.

    Single and compressed screens already measured the drop (they scored the negated objective); the gradient
    screen attributes the real objective, so its prediction is negated here. The intact accuracy is the real one.
    """
    delta = screen.delta
    if screen.method == "gradient":  # predicted change of the real objective -> predicted drop
        delta = [[-v for v in row] for row in delta]
    extra = dict(screen.extra)
    if "intact_objective" in extra:  # the mean of the negated (margin: clipped) values, not the task's own mean
        extra["intact_removal_objective"] = extra.pop("intact_objective")
    extra.update(direction=REMOVE, removes=target)
    clipped = " (per example only a margin still above 0 counts)" if extra.get("objective") == "margin" else ""
    rule = (f"remove direction: each score is the drop of {target}'s objective{clipped} when the head(s) are "
            f"zeroed (positive = zeroing removes more of the capability; a head the task needs). {screen.rule}")
    return replace(screen, delta=delta, rule=rule, intact_acc=1.0 - screen.intact_acc,
                   unit=f"drop in {screen.unit}", extra=extra)


def screen_reporter(method: str, reporter: Reporter) -> Reporter:
    """Events of a screen in the remove direction: the gradient screen's per-head predictions negated (the
    other screens already score the drop), so live heatmaps match screen.json."""
    if method != "gradient":
        return reporter

    def flip(event: Event) -> None:
        if isinstance(event, HeadScored):
            event = replace(event, delta=-event.delta)
        reporter(event)

    return flip


def search_fields(result: SearchResult, target: str, constraint: RetainConstraint | None) -> dict[str, Any]:
    """search.json additions: the direction, the rule in its terms, and every retain check the search made."""
    clipped = " (per example only a margin still above 0 counts)" if result.objective == "margin" else ""
    retained = (f"; a set is selectable only when {constraint.to_json()['rule']}" if constraint is not None else "")
    out: dict[str, Any] = {
        "direction": REMOVE, "removes": target,
        "rule": (f"remove {target}: the search maximises the drop of its {result.objective}{clipped}, i.e. the "
                 f"objective below is the negated one{retained}; {result.rule}"),
        "direction_note": ("the search ran on the negated objective of the target: in this file's trace and steps, "
                           "acc is the target's error rate and a gain is a drop of the target"),
    }
    if constraint is not None:
        out["retain"] = constraint.to_json()
    return out


def selection_fields(result: SearchResult, target: Scorer, constraint: RetainConstraint | None,
                     tolerance: float) -> dict[str, Any]:
    """selection.json in the task's own sense (real accuracies: intact -> edited, a negative gain) plus the
    direction and how each retain task moved under the selected set on its discovery split."""
    plain = raw(target)
    chosen = result.selected
    intact_acc, acc = plain.accuracy(()), plain.accuracy(chosen)
    intact_obj, obj = plain.mean(()), plain.mean(chosen)
    factor = scale(result.objective)
    out: dict[str, Any] = {
        "direction": REMOVE, "discovery_acc": acc, "intact_acc": intact_acc, "gain_points": 100.0 * (acc - intact_acc),
        "target_drop_points": 100.0 * (intact_acc - acc), "intact_objective": intact_obj,
        "selected_objective": obj, "objective_gain": factor * (obj - intact_obj), "retain_tolerance": tolerance,
        "reason": (f"remove direction (the search raised the negated {result.objective}, i.e. the target's drop): "
                   f"{result.reason}"),
    }
    rejected = result.best_rejected
    if rejected is not None:  # its figures were the search's (drops): back to the task's own sense
        out["best_rejected"] = {**rejected, "objective_gain": -float(rejected["objective_gain"]),
                                "gain_points": -float(rejected["gain_points"])}
    if constraint is not None:
        intact = constraint.intact()
        checks = constraint.checks(chosen) if chosen else {k: RetainCheck(0.0, (0.0, 0.0)) for k in intact}
        out["retain"] = [{"task": name, "intact_acc": intact[name],
                          "edited_acc": intact[name] + checks[name].change / 100.0,
                          "change_points": checks[name].change, "ci_points": list(checks[name].ci),
                          "n": constraint.scorers[name].n, "within_tolerance": checks[name].within(tolerance)}
                         for name in intact]
    return out


def retain_names(recipe: Any) -> tuple[str, ...]:
    """The tasks a removal must retain: `discovery.retain`, else `validation.side_tasks` (none when improving)."""
    d = recipe.discovery
    if getattr(d, "direction", IMPROVE) != REMOVE:
        return ()
    return tuple(d.retain) if d.retain is not None else tuple(recipe.validation.side_tasks)


def outcome_lines(selection: Mapping[str, Any]) -> list[str]:
    """What a remove run's selection means, for the CLI (nothing for an improving run)."""
    if selection.get("direction") != REMOVE:
        return []
    lines = [f"direction: remove; the target fell {float(selection.get('target_drop_points') or 0.0):.2f} points on "
             f"discovery; retain tolerance {float(selection.get('retain_tolerance') or 0.0):g} points"]
    for row in selection.get("retain") or []:
        lo, hi = row.get("ci_points") or (0.0, 0.0)
        lines.append(f"retained {row['task']}: {100 * row['intact_acc']:.2f}% -> {100 * row['edited_acc']:.2f}% "
                     f"({row['change_points']:+.2f} points, interval [{lo:+.2f}, {hi:+.2f}], n={row.get('n', '?')}): "
                     + ("within tolerance" if row.get("within_tolerance") else "BEYOND tolerance"))
    return lines


def describe(target: str, retain: Sequence[str], tolerance: float, objective: str) -> str:
    """One line for logs and the CLI: what a remove run searches for."""
    return (f"direction: remove {target} (the search maximises its drop in {unit(objective)}), retaining "
            f"{', '.join(retain)} within {tolerance:g} accuracy points (the change's interval, on their own "
            "discovery splits)")


__all__ = ["IMPROVE", "REMOVE", "RETAIN_SPLIT", "RemovalScorer", "RetainCheck", "RetainConstraint", "describe", "label_screen",
           "outcome_lines", "raw", "retain_names", "screen_reporter", "search_fields", "selection_fields"]
