"""Per-stage progress: a bar, done/total counts and an ETA for every stage the library reports."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from headedit.events import StageFinished, StageProgress, StageStarted


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass
class StageState:
    name: str
    description: str = ""
    total: int | None = None
    done: int = 0
    started: float = 0.0
    finished: bool = False
    summary: str = ""
    rate_from: tuple[float, int] = field(default=(0.0, 0))

    def eta(self, now: float) -> float | None:
        """Seconds left at the mean rate so far; None until there is a rate to go on."""
        if self.finished or not self.total or self.done <= 0 or self.done >= self.total:
            return None
        elapsed = now - self.started
        if elapsed <= 0:
            return None
        return elapsed / self.done * (self.total - self.done)


class StageProgressPanel(Widget):
    """Renders one row per stage in the order the stages started."""

    DEFAULT_CSS = """
    StageProgressPanel { height: auto; min-height: 1; }
    """

    clock: Callable[[], float] = staticmethod(time.monotonic)  # tests swap in a fixed clock

    def __init__(self, placeholder: str = "", *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.placeholder = placeholder
        self.stages: dict[str, StageState] = {}

    def clear(self) -> None:
        self.stages.clear()
        self.refresh(layout=True)

    def handle(self, event: object) -> bool:
        """Apply a stage event; returns False for events this panel does not show."""
        now = self.clock()
        if isinstance(event, StageStarted):
            self.stages[event.stage] = StageState(event.stage, event.description, event.total, 0, now)
        elif isinstance(event, StageProgress):
            state = self.stages.setdefault(event.stage, StageState(event.stage, started=now))
            state.done = event.done
            if event.total is not None:
                state.total = event.total
        elif isinstance(event, StageFinished):
            state = self.stages.setdefault(event.stage, StageState(event.stage, started=now))
            state.finished, state.summary = True, event.summary
            if state.total is not None:
                state.done = max(state.done, state.total)
        else:
            return False
        self.refresh(layout=True)
        return True

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.stages) or (1 if self.placeholder else 0)

    def render(self) -> Table | Text:
        if not self.stages:
            return Text(self.placeholder, style="dim")
        now = self.clock()
        grid = Table.grid(padding=(0, 1), expand=True)
        grid.add_column(max_width=16, no_wrap=True, overflow="ellipsis")
        grid.add_column(ratio=1, min_width=6)
        grid.add_column(no_wrap=True, justify="right")
        grid.add_column(no_wrap=True, min_width=11)
        for state in self.stages.values():
            total = state.total if state.total else max(state.done, 1)
            bar = ProgressBar(total=total, completed=min(state.done, total), finished_style="green",
                              complete_style="cyan" if not state.finished else "green")
            count = f"{state.done}/{state.total}" if state.total else (str(state.done) if state.done else "")
            if state.finished:
                tail = Text("done", style="green")
            else:
                eta = state.eta(now)
                tail = Text("ETA " + (format_duration(eta) if eta is not None else "--:--"), style="dim")
            grid.add_row(Text(state.name, style="bold"), bar, count, tail)
        return grid
