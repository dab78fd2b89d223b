"""Joint search over the screen's top-k candidates: greedy forward selection with a beam, or exhaustive.

Candidates are the k highest screen scores even when zero or negative, because a head that is
harmless alone can be half of a helpful pair; `first_additions_all_heads` lets the first two
additions draw from every head for the same reason. Sets are ranked by the scorer's objective
(`headedit.discovery.objective`), and a step is accepted only on evidence (`headedit.discovery.evidence`):
its best set must beat the current best set under a one-sided paired test at `alpha`, corrected for every
set the step could have produced. When the first step fails, nothing is selected: "no set found" is a result,
recorded with its reason. Every set goes through the journaled scorer, so re-trying a set is free and a
resumed search replays to the same selection.

Exact pruning (`prune`, accuracy objective only): the sets of one size are scored on doubling prefixes of the
split (`prune_chunk`, 2x, 4x, ... examples). After the first look the `need` most promising sets are completed
(`need` = beam width, or 1 at the last size), so the `need`-th best final count T is known; a set is dropped
once even all its unseen examples right could not reach T (`correct_so_far + unseen < T`). Such a set ranks
strictly below `need` completed sets, so the beam, the step's best set and the selection are exactly those of
the unpruned search; only the cost changes. A continuous objective has no such bound: every set is completed.
The decisions depend only on the journal's rows (resume-safe).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any, Protocol

from headedit.discovery import evidence
from headedit.discovery.objective import scale
from headedit.discovery.scorer import Scorer
from headedit.events import (
    Reporter,
    StageFinished,
    StageProgress,
    StageStarted,
    null_reporter,
)
from headedit.model.heads import Head, format_heads

STAGE = "search"
ALL_HEADS_ADDITIONS = 2  # how many first additions draw from every head when asked


DEFAULT_ALPHA = 0.05  # evidence level per step (docs/discovery.md: why this value)

Ranked = list[tuple[tuple[Head, ...], float]]  # (set, mean objective), best first


class Constraint(Protocol):
    """A condition every selectable set must meet beyond the objective (headedit.discovery.direction's retain
    tasks): `admit` keeps, in rank order, the sets that meet it (checking lazily, at least `need` of them when it
    can); `refusal` says why a step had none. With a constraint every set is scored completely (no pruning)."""

    def admit(self, ranked: Ranked, need: int) -> Ranked: ...

    def refusal(self, size: int) -> str: ...


@dataclass(frozen=True)
class SearchSpec:
    method: str = "greedy"  # greedy | exhaustive
    beam: int = 2
    max_heads: int = 6
    min_gain: float = 0.0  # discovery-accuracy points a step must add over the current best; 0 = no floor
    exhaustive_size: int = 2
    first_additions_all_heads: bool = False
    prune: bool = True  # exact bound pruning (module docstring; accuracy objective); the selection is unchanged
    prune_chunk: int = 32  # first look, in examples (a multiple of the engine's batch keeps its caches warm)
    alpha: float = DEFAULT_ALPHA  # one-sided test level per step, before the multiplicity correction; 1 = no test
    independent_pool: bool = False  # the screen saw other rows than the search: the family is the sets tried

    @classmethod
    def from_recipe(cls, d: Any) -> SearchSpec:
        return cls(d.search, d.beam, d.max_heads, d.min_gain, d.exhaustive_size, d.first_additions_all_heads,
                   bool(getattr(d, "prune", True)), int(getattr(d, "prune_chunk", 32)),
                   float(getattr(d, "alpha", DEFAULT_ALPHA)), bool(getattr(d, "screen_rows", 0)))

    def rule(self, k: int, objective: str = "accuracy") -> str:
        pool = f"candidates: the {k} highest screen scores (even if zero or negative)"
        if self.first_additions_all_heads:
            pool += f"; the first {ALL_HEADS_ADDITIONS} additions draw from every head"
        if self.method == "exhaustive":
            how = (f"every subset of the candidates up to size {self.exhaustive_size} (one step per size, the family "
                   f"being every subset of all heads up to that size), then greedy additions with beam {self.beam} "
                   f"from the best {self.beam} of the largest size")
        else:
            how = f"greedy forward selection with beam {self.beam}, adding one head per size"
        stop = (f"the search stops at the first step not accepted (exhaustive: after its sizes, if none was) or at "
                f"{self.max_heads} heads; selection = the last accepted set, none when no step is accepted; ranking "
                "ties: fewer heads, then head text")
        rule = f"{pool}; {how}; {evidence.rule(objective, self.alpha, self.min_gain, self.independent_pool)}; {stop}"
        if self.prune and objective == "accuracy":
            rule += (f"; exact pruning: sets scored on {self.prune_chunk}, {2 * self.prune_chunk}, ... examples, a set "
                     "dropped once its correct count plus its unseen examples is below the final count of the "
                     "beam-th best completed set (it cannot enter the beam; the selection is unchanged)")
        return rule


@dataclass
class SearchResult:
    rule: str
    intact_acc: float
    selected: tuple[Head, ...]
    selected_acc: float
    trace: list[dict[str, Any]] = field(default_factory=list)
    evaluations: int = 0
    candidates: list[Head] = field(default_factory=list)
    objective: str = "accuracy"
    intact_objective: float = 0.0  # mean per-example objective
    selected_objective: float = 0.0
    steps: list[dict[str, Any]] = field(default_factory=list)  # evidence.Step records, one per size tried
    reason: str = ""  # why the search ended, in words

    @property
    def found(self) -> bool:
        return bool(self.selected)

    @property
    def best_rejected(self) -> dict[str, Any] | None:
        """With nothing found: the first step's best set and why it was not accepted (for the user, never exported
        silently)."""
        if self.found or not self.steps or not self.steps[0]["best"]:
            return None
        first = self.steps[0]
        return {k: first[k] for k in ("best", "objective_gain", "gain_points", "p", "threshold", "family")}

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule, "candidates": format_heads(self.candidates) if self.candidates else "",
            "candidate_order": [str(h) for h in self.candidates],
            "trace": self.trace, "evaluations": self.evaluations, "selected": format_heads(self.selected),
            "selected_acc": self.selected_acc, "intact_acc": self.intact_acc, "objective": self.objective,
            "intact_objective": self.intact_objective, "selected_objective": self.selected_objective,
            "found": self.found, "reason": self.reason, "steps": self.steps, "best_rejected": self.best_rejected,
        }


def _order(item: tuple[tuple[Head, ...], float]) -> tuple:
    heads, score = item
    return (-score, len(heads), format_heads(heads))


def looks(n: int, chunk: int) -> list[int]:
    """Example counts after which pruning decisions are made: chunk, 2*chunk, 4*chunk, ..., then n."""
    marks, k = [], max(1, chunk)
    while k < n:
        marks.append(k)
        k *= 2
    return marks + [n]


def _ranked(scorer: Scorer, sets: list[tuple[Head, ...]], need: int, spec: SearchSpec,
            seen: dict[str, int]) -> list[tuple[tuple[Head, ...], float]]:
    """(set, mean objective) best first, exact for every set that can be among the top `need`; pruned sets follow.

    `seen[key]` gets the examples each set was scored on (n = complete). Pruned sets (accuracy objective only)
    carry their accuracy on the examples they saw; they rank after every completed set (they are provably below
    `need` of them).
    """
    n = scorer.n
    if not spec.prune or scorer.continuous or n == 0 or len(sets) <= need:
        scorer.ensure(sets, stage=STAGE)
        for s in sets:
            seen[format_heads(s)] = n
        return sorted(((s, scorer.mean(s)) for s in sets), key=_order)
    final: dict[str, int] = {}  # key -> correct count on all n examples
    partial: dict[str, tuple[int, int]] = {}  # key -> (correct so far, examples seen)
    alive = list(sets)

    def complete(group: list[tuple[Head, ...]]) -> None:
        for s, b in zip(group, scorer.ensure(group, stage=STAGE)):
            final[format_heads(s)] = int(b.sum())

    def bar() -> int:  # the need-th best final count so far; -1 until `need` sets are complete
        counts = sorted(final.values(), reverse=True)
        return counts[need - 1] if len(counts) >= need else -1

    for m in looks(n, spec.prune_chunk):
        todo = [s for s in alive if format_heads(s) not in final]
        for s, b in zip(todo, scorer.ensure(todo, upto=m, stage=STAGE)):
            partial[format_heads(s)] = (int(b.sum()), m)
            if m == n:
                final[format_heads(s)] = int(b.sum())
        if len(final) < need:  # complete the most promising sets so the bar is known early
            open_ = sorted((s for s in alive if format_heads(s) not in final),
                           key=lambda s: (-partial[format_heads(s)][0], len(s), format_heads(s)))
            complete(open_[: need - len(final)])
        t = bar()
        alive = [s for s in alive if format_heads(s) in final or partial[format_heads(s)][0] + (n - m) >= t]
    done = [s for s in sets if format_heads(s) in final]
    dropped = [s for s in sets if format_heads(s) not in final]
    for s in done:
        seen[format_heads(s)] = n
    for s in dropped:
        seen[format_heads(s)] = partial[format_heads(s)][1]
    ranked = sorted(((s, final[format_heads(s)] / n) for s in done), key=_order)
    tail = sorted(((s, partial[format_heads(s)][0] / partial[format_heads(s)][1]) for s in dropped), key=_order)
    return ranked + tail


def joint_search(
    scorer: Scorer,
    candidates: Sequence[Head],
    all_heads: Sequence[Head],
    spec: SearchSpec,
    reporter: Reporter = null_reporter,
    constraint: Constraint | None = None,
) -> SearchResult:
    pool = list(candidates)
    if constraint is not None and spec.prune:
        spec = replace(spec, prune=False)  # pruned sets carry partial scores; a constraint may need any of them
    objective, factor, n = scorer.objective, scale(scorer.objective), scorer.n
    reporter(StageStarted(STAGE, total=spec.max_heads, description=f"joint search over {len(pool)} candidates"))
    scorer.ensure([()], stage=STAGE)
    intact_acc, intact_obj = scorer.accuracy(()), scorer.mean(())
    intact_values, intact_bits = scorer.values(()), scorer.bits(())
    trace: list[dict[str, Any]] = []
    steps: list[evidence.Step] = []
    tried: dict[str, int] = {}  # key -> examples seen
    pruned = 0

    def evaluate(sets: list[tuple[Head, ...]], need: int) -> list[tuple[tuple[Head, ...], float]]:
        """Sets ranked best first by mean objective; exact for the top `need` (pruning may cut the rest short)."""
        nonlocal pruned
        fresh = []
        for s in sets:
            key = format_heads(s)
            if key not in tried:
                tried[key] = 0
                fresh.append(s)
        seen: dict[str, int] = {}
        ranked = _ranked(scorer, fresh, max(1, need), spec, seen)
        for s, score in ranked:
            key = format_heads(s)
            tried[key] = m = seen[key]
            bits = scorer.bits(s, m)
            acc = float(bits.mean()) if m else 0.0
            entry: dict[str, Any] = {"heads": key, "size": len(s), "acc": acc, "gain": 100.0 * (acc - intact_acc)}
            if scorer.continuous:
                entry.update(objective=score, objective_gain=factor * (score - intact_obj))
            if m < n:  # pruned: accuracy and paired gain on the examples it saw
                pruned += 1
                entry.update(n=m, pruned=True, gain=100.0 * (acc - float(intact_bits[:m].mean())))
            trace.append(entry)
        known = {format_heads(s): a for s, a in ranked}
        old = [(s, scorer.mean(s)) for s in sets if format_heads(s) not in known and tried.get(format_heads(s)) == n]
        full = sorted([x for x in ranked if tried[format_heads(x[0])] == n] + old, key=_order)
        out = full + [x for x in ranked if tried[format_heads(x[0])] < n]
        return constraint.admit(out, max(1, need)) if constraint is not None else out

    def accept(size: int, scored: list[tuple[tuple[Head, ...], float]], family: int) -> bool:
        """Test the step's best (complete) set against the current best; record the decision."""
        top = scored[0][0]
        ref_values = scorer.values(best) if best else intact_values
        ref_bits = scorer.bits(best) if best else intact_bits
        step = evidence.decide(objective, spec.alpha, spec.min_gain, size, family, top, best, scorer.values(top),
                               ref_values, scorer.bits(top), ref_bits)
        steps.append(step)
        return step.accepted

    def pool_for(size: int) -> list[Head]:
        if spec.first_additions_all_heads and size <= ALL_HEADS_ADDITIONS:
            return list(all_heads)
        return pool

    best: tuple[Head, ...] = ()
    beam: list[tuple[Head, ...]] = [()]
    start = 1
    if spec.method == "exhaustive":
        size_cap = min(spec.exhaustive_size, spec.max_heads, len(pool))
        universe = len(pool) if spec.independent_pool else len(all_heads)
        family = sum(evidence.exhaustive_family(universe, k) for k in range(1, size_cap + 1))
        last: list[tuple[tuple[Head, ...], float]] = []
        for size in range(1, size_cap + 1):
            need = spec.beam if size == size_cap and size < spec.max_heads else 1
            last = evaluate([tuple(sorted(c)) for c in combinations(sorted(pool), size)], need)
            if last and accept(size, last, family):
                best = last[0][0]
            reporter(StageProgress(STAGE, size, spec.max_heads))
        beam = [s for s, _ in last[: spec.beam]] if best else []
        start = size_cap + 1
    for size in range(start, spec.max_heads + 1):
        expansions: dict[str, tuple[Head, ...]] = {}
        for base in beam:
            for h in pool_for(size):
                if h not in base:
                    s = tuple(sorted(base + (h,)))
                    expansions.setdefault(format_heads(s), s)
        if not expansions:
            break
        scored = evaluate([expansions[k] for k in sorted(expansions)], spec.beam if size < spec.max_heads else 1)
        reporter(StageProgress(STAGE, size, spec.max_heads))
        family = evidence.greedy_family(beam, pool_for(size) if spec.independent_pool else all_heads)
        if not scored and constraint is not None:  # every set of this size broke the constraint
            steps.append(evidence.Step(size, "", format_heads(best), 0.0, 0.0, 1.0, family, spec.alpha / family,
                                       False, constraint.refusal(size)))
            break
        if not accept(size, scored, family):
            break
        best = scored[0][0]
        beam = [s for s, _ in scored[: spec.beam]]
    accepted = [st for st in steps if st.accepted]
    if not steps:
        reason = "no candidate set to try"
    elif not best:
        reason = "no set found: " + steps[0].reason if len(steps) == 1 else \
            "no set found: " + "; ".join(st.reason for st in steps)
    else:
        ended = steps[-1].reason if not steps[-1].accepted else f"reached max_heads = {spec.max_heads}" \
            if len(best) >= spec.max_heads else "no further set to try"
        reason = f"{len(accepted)} step(s) accepted, ending with {format_heads(best)}; stopped: {ended}"
    result = SearchResult(
        rule=spec.rule(len(pool), objective), intact_acc=intact_acc, selected=best,
        selected_acc=scorer.accuracy(best), trace=trace, evaluations=len(trace), candidates=pool,
        objective=objective, intact_objective=intact_obj, selected_objective=scorer.mean(best),
        steps=[st.to_json() for st in steps], reason=reason,
    )
    note = f", {pruned} pruned" if pruned else ""
    if best:
        text = (f"selected {format_heads(best)}: {100 * result.selected_acc:.2f}% vs intact {100 * intact_acc:.2f}% "
                f"({len(trace)} sets{note})")
    else:
        text = f"{reason} ({len(trace)} sets{note})"
    reporter(StageFinished(STAGE, text))
    return result
