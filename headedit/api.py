"""The small Python API: `headedit.discover`, `validate`, `export`, `evaluate`.

The same stages the CLI runs, for notebooks and scripts: each takes an optional `progress` callback that
receives the typed events of `headedit.events` (StageStarted, StageProgress, StageFinished, HeadScored,
SetEvaluated, Log) and returns what the stage produced. Nothing is printed. Exposed lazily by
`headedit/__init__.py`, and this module imports no torch itself: loading a model does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headedit.events import Reporter, null_reporter
from headedit.recipe import Recipe


def _recipe(recipe: Recipe | str | Path) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    # lazy: `import headedit` stays free of torch, transformers and textual
    from headedit.recipe import load_recipe

    return load_recipe(str(recipe))


def discover(recipe: Recipe | str | Path | None = None, run_dir: str | Path | None = None, *, resume: bool = False,
             progress: Reporter | None = None) -> Path:
    """Screen heads and search joint ablations on the discovery split; returns the run folder.

    `recipe` is a recipe file (or a loaded `Recipe`); with `resume=True` give `run_dir` instead and the run
    continues where it stopped.
    """
    # lazy: `import headedit` stays free of torch, transformers and textual
    from headedit.pipeline import discover as run_discover

    return run_discover(None if recipe is None else _recipe(recipe), run_dir, resume=resume,
                        reporter=progress or null_reporter)


def validate(run_dir: str | Path, *, progress: Reporter | None = None) -> dict[str, Any]:
    """Held-out validation of the run's selected heads (intact vs the reloaded baked checkpoint): the content
    of validation.json (accuracies, gain, 95% CI, McNemar p, side tasks, general damage)."""
    # lazy: `import headedit` stays free of torch, transformers and textual
    from headedit.pipeline import validate as run_validate

    return run_validate(run_dir, progress or null_reporter)


def export(run_dir: str | Path, out: str | Path | None = None, *, push: str | None = None, force: bool = False,
           progress: Reporter | None = None) -> Path:
    """Bake the run's selected heads into a checkpoint with card, recipe and validation; optionally push."""
    # lazy: `import headedit` stays free of torch, transformers and textual
    from headedit.pipeline import export as run_export

    return Path(run_export(run_dir, out=out, push=push, force=force, reporter=progress or null_reporter))


def evaluate(model: Any, task: str, heads: str = "", split: str = "heldout", n: int | None = None, *,
             progress: Reporter | None = None, **options: Any) -> dict[str, Any]:
    """Accuracy of `model` (a folder, Hub id, `headedit:demo`, or a loaded model with `tokenizer=`) on the first
    `n` examples of a task split, with `heads` zeroed; see `headedit.pipeline.evaluate.evaluate` for options."""
    # lazy: `import headedit` stays free of torch, transformers and textual
    from headedit.pipeline.evaluate import evaluate as run_evaluate

    return run_evaluate(model, task, heads, split, n, progress=progress, **options)


__all__ = ["discover", "validate", "export", "evaluate"]
