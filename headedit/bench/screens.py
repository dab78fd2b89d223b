"""`headedit bench screens`: the three stage-1 screens on one model and split, side by side.

What a user choosing `discovery.screen` needs to know: how many evaluations each screen costs and how well the
cheaper screens' top candidates agree with the single screen (every head ablated alone, the reference).
Each screen runs from cold (its own engine and journal); the single screen runs without early stop so its
table is complete.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from headedit.discovery.scorer import Scorer
from headedit.discovery.table import ScreenResult, topk_overlap
from headedit.journal import Journal
from headedit.model.heads import HeadLayout
from headedit.tasks.base import Example, Task


def run_screens(model: Any, tokenizer: Any, task: Task, examples: Sequence[Example], k: int = 4,
                fraction: float = 0.25, sets: int | None = None, seed: int = 0,
                batch_size: int = 64) -> dict[str, Any]:
    """Per screen: wall seconds, distinct ablated sets evaluated, set-examples, its top-k, overlap@k with single."""
    # lazy: loaded when a benchmark runs
    from headedit.discovery.compressed import compressed_screen
    from headedit.discovery.gradient import gradient_screen
    from headedit.discovery.single import single_screen
    from headedit.engine.core import Engine

    layout = HeadLayout.from_model(model)
    examples = list(examples)
    count = sets if sets is not None else max(8, layout.total_heads // 2)

    def screen(name: str, scorer: Scorer, engine: Any) -> ScreenResult:
        if name == "single":
            return single_screen(scorer, layout, None)
        if name == "compressed":
            return compressed_screen(scorer, layout, count, fraction, seed)
        return gradient_screen(engine, task, examples, scorer, layout)

    out: dict[str, Any] = {"task": task.name, "n": len(examples), "heads": layout.total_heads, "k": k,
                           "fraction": fraction, "knockout_sets": count}
    results: dict[str, ScreenResult] = {}
    with tempfile.TemporaryDirectory(prefix="headedit-screens-") as tmp:
        for name in ("single", "compressed", "gradient"):
            engine = Engine(model, tokenizer, layout, batch_size=batch_size)
            with Journal(Path(tmp) / f"{name}.sqlite") as journal:
                journal.db.execute("PRAGMA synchronous=NORMAL")
                evaluate = engine.range_eval(task, examples)
                scorer = Scorer(journal, "discovery", len(examples), evaluate, sets_per_call=16)
                start = time.perf_counter()
                result = screen(name, scorer, engine)
                seconds = time.perf_counter() - start
            results[name] = result
            out[name] = {"seconds": seconds, "ablated_sets": max(0, scorer.sets_evaluated - 1),
                         "set_examples": scorer.examples_evaluated, "top": [str(h) for h in result.top(k)],  # best first
                         "rule": result.rule}
    for name in ("compressed", "gradient"):
        out[name]["overlap_with_single"] = topk_overlap(results[name], results["single"], k)
    out["single"]["overlap_with_single"] = 1.0
    return out
