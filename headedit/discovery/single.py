"""Single-head screen: every head ablated alone, scored on the discovery split.

Heads are evaluated chunk by chunk of examples (all still-active heads per chunk, many sets per
engine call), so the early-stop rule can drop a clearly harmful head after a fraction of the
split. Scores and drops use the scorer's objective (accuracy in points, or a continuous objective's mean
change). The loop is a pure function of the journal's rows: a resumed run replays the same drops.
"""
from __future__ import annotations

import numpy as np

from headedit.discovery.early_stop import EarlyStop
from headedit.discovery.objective import describe, scale, unit
from headedit.discovery.scorer import Scorer
from headedit.discovery.table import ScreenResult
from headedit.events import HeadScored, Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.model.heads import Head, HeadLayout

STAGE = "screen:single"


def single_screen(
    scorer: Scorer, layout: HeadLayout, early_stop: EarlyStop | None = None, reporter: Reporter = null_reporter
) -> ScreenResult:
    n = scorer.n
    heads = layout.all_heads()
    reporter(StageStarted(STAGE, total=n * len(heads), description=f"single-head screen ({len(heads)} heads x {n})"))
    scorer.ensure([()], stage=STAGE)
    intact = scorer.values(())
    factor = scale(scorer.objective)
    boundaries = early_stop.boundaries(n) if early_stop else [n]
    active = list(heads)
    stopped_at: dict[Head, int] = {}


    def progress(_: int = 0) -> None:
        # units: head x example; an early-stopped head's remaining examples leave the total
        caps = {h: stopped_at.get(h, n) for h in heads}
        done = sum(min(scorer.known((h,)), cap) for h, cap in caps.items())
        reporter(StageProgress(STAGE, done, sum(caps.values())))

    previous, scorer.on_work = scorer.on_work, progress
    for upto in boundaries:
        if not active:
            break
        scorer.ensure([(h,) for h in active], upto=upto, stage=STAGE)
        still: list[Head] = []
        for h in active:
            b = scorer.values((h,), upto)
            if upto == n:

                reporter(HeadScored(STAGE, h.layer, h.head, _delta(intact, b, factor), {"n": int(b.size)}))
            elif early_stop is not None and early_stop.should_drop(intact[:upto], b):
                stopped_at[h] = upto

                reporter(HeadScored(STAGE, h.layer, h.head, _delta(intact, b, factor),
                                    {"n": int(b.size), "stopped": True}))
            else:
                still.append(h)
        active = still
        progress()
    scorer.on_work = previous

    delta = [[0.0] * layout.num_heads for _ in range(layout.num_layers)]
    complete = [[True] * layout.num_heads for _ in range(layout.num_layers)]
    seen = [[n] * layout.num_heads for _ in range(layout.num_layers)]
    for h in heads:
        m = stopped_at.get(h, n)
        delta[h.layer][h.head] = _delta(intact, scorer.values((h,), m), factor)
        complete[h.layer][h.head] = h not in stopped_at
        seen[h.layer][h.head] = m
    rule = (f"each head zeroed alone; delta = paired change in the mean {describe(scorer.objective)} vs intact "
            f"({unit(scorer.objective)})")
    if early_stop is not None:
        rule += "; early stop: " + early_stop.rule()
    examples = int(sum(sum(row) for row in seen))
    result = ScreenResult(
        method="single", rule=rule, num_layers=layout.num_layers, num_heads=layout.num_heads,
        intact_acc=scorer.accuracy(()), delta=delta, evaluations=len(heads), complete=complete,
        unit=unit(scorer.objective),
        extra={
            "n": n, "objective": scorer.objective, "intact_objective": float(intact.mean()) if n else 0.0,
            "examples_per_head": seen, "early_stopped": len(stopped_at),
            "example_evaluations": examples, "full_cost_examples": n * len(heads),
            "early_stop": early_stop.to_dict() if early_stop else None,
        },
    )
    reporter(StageFinished(STAGE, f"{len(heads)} heads, {len(stopped_at)} stopped early, "
                                  f"{examples}/{n * len(heads)} head-examples"))
    return result


def _delta(intact: np.ndarray, ablated: np.ndarray, factor: float) -> float:
    """Paired change of the mean objective on the examples both saw, in the objective's unit."""
    if ablated.size == 0:
        return 0.0
    return float(factor * (ablated.mean() - intact[: ablated.size].mean()))
