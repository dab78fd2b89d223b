"""Discovery's remove direction wired to a loaded model: the retain tasks' journaled scorers and the hooks
`run_discovery` calls (headedit/discovery/direction.py holds the logic; this module only builds it)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, cast

from headedit.discovery import direction
from headedit.discovery.direction import RemovalScorer, RetainConstraint
from headedit.discovery.scorer import Scorer
from headedit.discovery.search import STAGE as SEARCH_STAGE
from headedit.discovery.search import SearchResult
from headedit.discovery.table import ScreenResult
from headedit.events import Event, Reporter, StageFinished
from headedit.journal import Journal
from headedit.model.heads import format_heads
from headedit.pipeline.loaded import DISCOVERY, Loaded, load_split, scorer_for
from headedit.pipeline.parallel import MirrorJournal, Shard
from headedit.recipe import Recipe
from headedit.tasks import get_task


@dataclass
class Removal:
    """What a `direction = "remove"` discovery adds to the improving one."""

    target: str
    objective: str
    tolerance: float
    constraint: RetainConstraint

    def describe(self) -> str:
        return direction.describe(self.target, list(self.constraint.scorers), self.tolerance, self.objective)

    def view(self, scorer: Scorer) -> Scorer:
        return RemovalScorer(scorer)

    def reporter(self, recipe: Recipe, reporter: Reporter) -> Reporter:
        return direction.screen_reporter(recipe.discovery.screen, reporter)

    def label(self, screen: ScreenResult) -> ScreenResult:
        return direction.label_screen(screen, self.target)

    def search_fields(self, result: SearchResult) -> dict[str, Any]:
        return direction.search_fields(result, self.target, self.constraint)

    def search_reporter(self, reporter: Reporter) -> Reporter:
        """The search's events, less its closing line (its accuracies are the target's error rates): `finish`
        says it in the task's own terms."""

        def hold(event: Event) -> None:
            if not (isinstance(event, StageFinished) and event.stage == SEARCH_STAGE):
                reporter(event)

        return hold

    def finish(self, result: SearchResult, target: Scorer, reporter: Reporter) -> dict[str, Any]:
        """selection.json's remove-direction fields; reports the search's closing line in real accuracies."""
        fields = direction.selection_fields(result, target, self.constraint, self.tolerance)
        if result.found:
            text = (f"selected {format_heads(result.selected)}: {self.target} {100 * fields['intact_acc']:.2f}% -> "
                    f"{100 * fields['discovery_acc']:.2f}% ({fields['gain_points']:+.2f} points; "
                    f"{result.evaluations} sets)")
        else:
            text = f"{fields['reason']} ({result.evaluations} sets)"
        reporter(StageFinished(SEARCH_STAGE, text))
        return fields


def removal_for(recipe: Recipe, loaded: Loaded, journal: Journal | MirrorJournal, objective: str, reporter: Reporter,
                cancel: threading.Event | None, shard: Shard | None = None) -> Removal | None:
    """The remove direction's pieces for this recipe, or None when it improves. Each retain task is scored on
    accuracy over its own discovery split (recipe.task.discovery rows, the same seed), journaled apart."""
    names = direction.retain_names(recipe)
    if recipe.discovery.direction != direction.REMOVE:
        return None
    scorers: dict[str, Scorer] = {}
    for name in names:
        task = get_task(name)
        examples = list(load_split(recipe, task, DISCOVERY).examples)
        # a rank's MirrorJournal answers the journal calls a scorer makes (as in run_discovery)
        scorers[name] = scorer_for(replace(loaded, task=task), cast(Journal, journal), direction.RETAIN_SPLIT + name,
                                   examples, reporter, cancel, shard)
    return Removal(loaded.task.name, objective, recipe.discovery.retain_tolerance,
                   RetainConstraint(scorers, recipe.discovery.retain_tolerance, level=1 - recipe.validation.alpha,
                                    n_boot=recipe.validation.bootstrap, seed=recipe.task.seed))


__all__ = ["Removal", "removal_for"]
