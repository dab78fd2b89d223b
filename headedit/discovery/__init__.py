"""Stage 1 screens and stage 2 joint search; all evaluation goes through the journaled `Scorer`."""
from __future__ import annotations

from typing import Any, Sequence

from headedit.discovery.early_stop import EarlyStop
from headedit.discovery.scorer import Cancelled, EvalFn, Scorer
from headedit.discovery.search import SearchResult, SearchSpec, joint_search
from headedit.discovery.table import ScreenResult, topk_overlap
from headedit.events import Reporter, null_reporter


def run_screen(
    recipe: Any,
    loaded: Any,
    scorer: Scorer,
    examples: Sequence[Any],
    early_stop: EarlyStop | None = None,
    reporter: Reporter = null_reporter,
) -> ScreenResult:
    """The recipe's screen (`discovery.screen`) on the discovery split."""
    d = recipe.discovery
    layout = loaded.layout
    if d.screen == "single":
        # lazy: only the chosen screen's module loads (the gradient screen needs torch)
        from headedit.discovery.single import single_screen

        return single_screen(scorer, layout, early_stop, reporter)
    if d.screen == "compressed":
        # lazy: only the chosen screen's module loads (the gradient screen needs torch)
        from headedit.discovery.compressed import compressed_screen

        count = d.compressed_set_count(layout.total_heads)
        return compressed_screen(scorer, layout, count, d.compressed_fraction, d.seed, reporter)
    if d.screen == "gradient":
        # lazy: only the chosen screen's module loads (the gradient screen needs torch)
        from headedit.discovery.gradient import gradient_screen

        return gradient_screen(loaded.engine, loaded.task, examples, scorer, layout, reporter)
    raise ValueError(f"unknown screen {d.screen!r}")


__all__ = [
    "EarlyStop", "Scorer", "Cancelled", "EvalFn", "ScreenResult", "SearchSpec", "SearchResult", "joint_search",
    "run_screen", "topk_overlap",
]
