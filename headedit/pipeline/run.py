"""`headedit run`: discover, validate and export in one go."""
from __future__ import annotations

import threading
from pathlib import Path

from headedit.events import Log, Reporter, null_reporter
from headedit.pipeline.discover import discover
from headedit.pipeline.export import export_run, run_export_blocked
from headedit.pipeline.validate import validate_run
from headedit.recipe import Recipe
from headedit.runs import Run


def run(
    recipe: Recipe,
    run_dir: str | Path | None = None,
    out: str | Path | None = None,
    push: str | None = None,
    force: bool = False,
    reporter: Reporter = null_reporter,
    cancel: threading.Event | None = None,
) -> tuple[Path, dict, Path | None]:
    """discover, validate, export: (run folder, validation, export folder or None when nothing was selected)."""
    path = discover(recipe, run_dir, reporter=reporter, cancel=cancel)
    result = validate_run(path, reporter, cancel)
    if not result.get("heads"):
        reason = Run.open(path).selection().get("reason") or "no head set improved discovery accuracy"
        reporter(Log(f"{reason}; nothing to export"))
        return path, result, None
    blocked = run_export_blocked(result, force)  # a set that failed validation is not exported unforced
    if blocked is not None:
        reporter(Log(blocked))
        return path, result, None
    exported = export_run(path, out=out, push=push, force=force, reporter=reporter)
    return path, result, Path(exported)


__all__ = ["run"]
