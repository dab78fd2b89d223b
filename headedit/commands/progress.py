"""The CLI's one progress reporter per output mode, for the library's typed events.

A terminal gets live rich bars (one per stage, counts, ETA); anything else (a pipe, `nohup`, a scheduler's log
file) gets plain lines: a line when a stage starts, at most one progress line per stage every `interval`
seconds (stage, done/total, rate, ETA) and a line when it ends. Both print the same `Log` messages and stage
summaries, so a log file tells what a terminal shows.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from headedit.events import Event, Log, StageFinished, StageProgress, StageStarted

INTERVAL_ENV = "HEADEDIT_PROGRESS_INTERVAL"  # seconds between plain progress lines per stage (default 10)
DEFAULT_INTERVAL = 10.0


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def clock(seconds: float) -> str:
    """12 s, 4:05, 1:02:03: short enough for a log line."""
    s = round(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


@dataclass
class _Stage:
    description: str
    total: int | None
    started: float
    base: int = 0  # units already done when first seen (a resumed stage): not counted in the rate
    done: int = 0
    printed: float = 0.0


class PlainReporter:
    """Plain, periodic progress lines for a log file; every line is flushed at once (a pipe is block-buffered)."""

    def __init__(self, console: Any, interval: float | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.interval = _interval() if interval is None else interval
        self.now = now
        self.stages: dict[str, _Stage] = {}

    def _line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        flush = getattr(self.console.file, "flush", None)
        if flush is not None:
            flush()

    def progress_line(self, stage: str) -> str:
        st = self.stages[stage]
        elapsed = self.now() - st.started
        parts = [f"{stage}: {st.done}/{st.total}" if st.total else f"{stage}: {st.done}"]
        if st.total:
            parts[0] += f" ({100 * st.done / st.total:.0f}%)"
        rate = (st.done - st.base) / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            parts.append(f"{rate:.3g}/s")
            if st.total and st.done < st.total:
                parts.append(f"ETA {clock((st.total - st.done) / rate)}")
        parts.append(f"elapsed {clock(elapsed)}")
        return ", ".join(parts)

    def __call__(self, event: Event) -> None:
        if isinstance(event, StageStarted):
            now = self.now()
            self.stages[event.stage] = _Stage(event.description or event.stage, event.total, now, printed=now)
            total = f" ({event.total} units)" if event.total else ""
            self._line(f"{event.stage}: started: {event.description or event.stage}{total}")
        elif isinstance(event, StageProgress):
            st = self.stages.get(event.stage)
            if st is None:  # progress without a start (a resumed stage): start counting here
                now = self.now()
                st = self.stages[event.stage] = _Stage(event.stage, event.total, now, base=event.done, printed=now)
            st.done, st.total = event.done, event.total if event.total is not None else st.total
            if self.now() - st.printed >= self.interval:
                st.printed = self.now()
                self._line(self.progress_line(event.stage))
        elif isinstance(event, StageFinished):
            st = self.stages.pop(event.stage, None)
            took = f" in {clock(self.now() - st.started)}" if st is not None else ""
            self._line(f"{event.stage}: done{took}" + (f": {event.summary}" if event.summary else ""))
        elif isinstance(event, Log):
            self._line(event.message if event.level == "info" else f"{event.level}: {event.message}")

    def close(self) -> None:
        self.stages.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class RichReporter:
    """Live rich bars, one per stage, with counts, elapsed time and ETA; summaries and logs printed above them."""

    def __init__(self, console: Any) -> None:
        # rich.progress only when a terminal draws bars: keeps it out of plain runs and CLI start-up
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), console=console, transient=False,
        )
        self.tasks: dict[str, Any] = {}
        self.started = False

    def __call__(self, event: Event) -> None:
        from rich.text import Text

        if isinstance(event, StageStarted):
            if not self.started:
                self.progress.start()
                self.started = True
            self.tasks[event.stage] = self.progress.add_task(event.description or event.stage, total=event.total)
        elif isinstance(event, StageProgress) and event.stage in self.tasks:
            self.progress.update(self.tasks[event.stage], completed=event.done, total=event.total)
        elif isinstance(event, StageFinished):
            task_id = self.tasks.pop(event.stage, None)
            if task_id is not None:
                task = next(t for t in self.progress.tasks if t.id == task_id)
                self.progress.update(task_id, completed=task.total or task.completed or 1, total=task.total or 1)
            if event.summary:
                self.progress.console.print(Text.assemble((event.stage, "bold"), f": {event.summary}"))
        elif isinstance(event, Log):
            style = {"warning": "yellow", "error": "red"}.get(event.level, "dim")
            self.progress.console.print(Text(event.message, style=style))

    def close(self) -> None:
        if self.started:
            self.progress.stop()
            self.started = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def reporter_for(console: Any, interval: float | None = None) -> RichReporter | PlainReporter:
    """The reporter for this console: live bars on a terminal, plain periodic lines otherwise.

    Use as a context manager, so a live display stops cleanly on errors too.
    """
    if getattr(console, "is_terminal", False):
        return RichReporter(console)
    return PlainReporter(console, interval)


# The names commands use; one implementation behind both.
rich_reporter = reporter_for
progress_reporter = reporter_for

__all__ = [
    "INTERVAL_ENV",
    "PlainReporter",
    "RichReporter",
    "clock",
    "progress_reporter",
    "reporter_for",
    "rich_reporter",
]
