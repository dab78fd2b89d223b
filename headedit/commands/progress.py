"""Minimal rich progress rendering of library events for simple commands (bake, push)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from headedit.events import Event, Log, Reporter, StageFinished, StageProgress, StageStarted


@contextmanager
def progress_reporter(console: Any) -> Iterator[Reporter]:
    """A reporter that draws one rich progress bar per stage, with counts and ETA."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=console, transient=False, disable=not console.is_terminal,
    )
    tasks: dict[str, Any] = {}

    def report(event: Event) -> None:
        if isinstance(event, StageStarted):
            tasks[event.stage] = progress.add_task(event.description or event.stage, total=event.total)
        elif isinstance(event, StageProgress) and event.stage in tasks:
            progress.update(tasks[event.stage], completed=event.done, total=event.total)
        elif isinstance(event, StageFinished) and event.stage in tasks:
            task_id = tasks.pop(event.stage)
            total = next(t.total for t in progress.tasks if t.id == task_id)
            progress.update(task_id, completed=total or 1, total=total or 1)
        elif isinstance(event, Log):
            progress.console.print(event.message)

    with progress:
        yield report
