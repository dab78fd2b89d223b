"""Joint search over the screen's top-k candidates: greedy forward selection with a beam, or exhaustive.

Candidates are the k highest screen scores even when zero or negative, because a head that is
harmless alone can be half of a helpful pair; `first_additions_all_heads` lets the first two
additions draw from every head for the same reason. Every set goes through the journaled scorer,
so re-trying a set is free and a resumed search replays to the same selection.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Sequence

from ..events import Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from ..heads import Head, format_heads
from .scorer import Scorer

STAGE = "search"
ALL_HEADS_ADDITIONS = 2  # how many first additions draw from every head when asked


@dataclass(frozen=True)
class SearchSpec:
    method: str = "greedy"  # greedy | exhaustive
    beam: int = 2
    max_heads: int = 6
    min_gain: float = 0.1  # points a new size must add over the best so far to continue
    exhaustive_size: int = 2
    first_additions_all_heads: bool = False

    @classmethod
    def from_recipe(cls, d: Any) -> "SearchSpec":
        return cls(d.search, d.beam, d.max_heads, d.min_gain, d.exhaustive_size, d.first_additions_all_heads)

    def rule(self, k: int) -> str:
        pool = f"candidates: the {k} highest screen scores (even if zero or negative)"
        if self.first_additions_all_heads:
            pool += f"; the first {ALL_HEADS_ADDITIONS} additions draw from every head"
        if self.method == "exhaustive":
            how = (f"every subset of the candidates up to size {self.exhaustive_size}, then greedy additions with "
                   f"beam {self.beam} from the best {self.beam} of them")
        else:
            how = f"greedy forward selection with beam {self.beam}, adding one head per size"
        stop = (f"stop when a size's best set is not at least {self.min_gain:g} points above the best so far, or at "
                f"{self.max_heads} heads; selection = best discovery accuracy (ties: fewer heads, then head text)")
        return f"{pool}; {how}; {stop}"


@dataclass
class SearchResult:
    rule: str
    intact_acc: float
    selected: tuple[Head, ...]
    selected_acc: float
    trace: list[dict[str, Any]] = field(default_factory=list)
    evaluations: int = 0
    candidates: list[Head] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule, "candidates": format_heads(self.candidates) if self.candidates else "",
            "candidate_order": [str(h) for h in self.candidates],
            "trace": self.trace, "evaluations": self.evaluations, "selected": format_heads(self.selected),
            "selected_acc": self.selected_acc, "intact_acc": self.intact_acc,
        }


def _order(item: tuple[tuple[Head, ...], float]) -> tuple:
    heads, acc = item
    return (-acc, len(heads), format_heads(heads))


def joint_search(
    scorer: Scorer,
    candidates: Sequence[Head],
    all_heads: Sequence[Head],
    spec: SearchSpec,
    reporter: Reporter = null_reporter,
) -> SearchResult:
    pool = list(candidates)
    reporter(StageStarted(STAGE, total=spec.max_heads, description=f"joint search over {len(pool)} candidates"))
    (intact,) = scorer.ensure([()], stage=STAGE)
    intact_acc = float(intact.mean()) if scorer.n else 0.0
    trace: list[dict[str, Any]] = []
    tried: set[str] = set()

    def evaluate(sets: list[tuple[Head, ...]]) -> list[tuple[tuple[Head, ...], float]]:
        fresh = []
        for s in sets:
            key = format_heads(s)
            if key not in tried:
                tried.add(key)
                fresh.append(s)
        scorer.ensure(fresh, stage=STAGE)
        for s in fresh:
            acc = scorer.accuracy(s)
            trace.append({"heads": format_heads(s), "size": len(s), "acc": acc, "gain": 100.0 * (acc - intact_acc)})
        return sorted(((s, scorer.accuracy(s)) for s in sets), key=_order)

    def pool_for(size: int) -> list[Head]:
        if spec.first_additions_all_heads and size <= ALL_HEADS_ADDITIONS:
            return list(all_heads)
        return pool

    best: tuple[tuple[Head, ...], float] = ((), intact_acc)
    beam: list[tuple[Head, ...]] = [()]
    start = 1
    if spec.method == "exhaustive":
        size_cap = min(spec.exhaustive_size, spec.max_heads, len(pool))
        last: list[tuple[tuple[Head, ...], float]] = []
        for size in range(1, size_cap + 1):
            last = evaluate([tuple(sorted(c)) for c in combinations(sorted(pool), size)])
            if last and last[0][1] * 100.0 >= best[1] * 100.0 + spec.min_gain - 1e-9:
                best = last[0]
            reporter(StageProgress(STAGE, size, spec.max_heads))
        beam = [s for s, _ in last[: spec.beam]]
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
        scored = evaluate([expansions[k] for k in sorted(expansions)])
        reporter(StageProgress(STAGE, size, spec.max_heads))
        top = scored[0]
        if top[1] * 100.0 < best[1] * 100.0 + spec.min_gain - 1e-9:
            break
        best = top
        beam = [s for s, _ in scored[: spec.beam]]
    result = SearchResult(
        rule=spec.rule(len(pool)), intact_acc=intact_acc, selected=best[0], selected_acc=best[1], trace=trace,
        evaluations=len(trace), candidates=pool,
    )
    reporter(StageFinished(STAGE, f"selected {format_heads(best[0]) or '(none)'}: "
                                  f"{100 * best[1]:.2f}% vs intact {100 * intact_acc:.2f}% ({len(trace)} sets)"))
    return result
