"""Rich rendering for the CLI: progress bars per stage, the screen heatmap, the validation table.

The library only emits events; this turns them into terminal output. Nothing here is imported by
the library itself.
"""
from __future__ import annotations

from typing import Any, Mapping

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from headedit.events import Event, HeadScored, Log, StageFinished, StageProgress, StageStarted
from headedit.model.heads import parse_heads
from headedit.stats import format_p


class RichReporter:
    """A Reporter (callable) that draws one progress bar per stage with counts and ETA.

    Use as a context manager, or call `close()` at the end, so the live display stops cleanly.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), console=console, transient=False, disable=not console.is_terminal,
        )
        self.tasks: dict[str, Any] = {}
        self.started = False

    def __call__(self, event: Event) -> None:
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
                self.progress.console.print(f"[bold]{event.stage}[/bold]: {event.summary}")
        elif isinstance(event, Log):
            style = {"warning": "yellow", "error": "red"}.get(event.level, "dim")
            self.progress.console.print(Text(event.message, style=style))
        elif isinstance(event, HeadScored):
            return

    def close(self) -> None:
        if self.started:
            self.progress.stop()
            self.started = False

    def __enter__(self) -> "RichReporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def rich_reporter(console: Console) -> RichReporter:
    return RichReporter(console)


def _cell_style(value: float, scale: float) -> str:
    """Green for gains, red for losses, intensity by |value| / scale."""
    if scale <= 0 or value == 0:
        return "on grey23"
    t = min(1.0, abs(value) / scale)
    level = int(round(40 + 160 * t))
    return f"on rgb(0,{level},0)" if value > 0 else f"on rgb({level},0,0)"


def render_heatmap(screen: Mapping[str, Any], selected: str = "", max_columns: int = 64) -> Any:
    """Layer x head table of the screen's deltas (rows = layers); selected heads marked with '*'.

    Wide models are shown in blocks of `max_columns` heads so the table fits a terminal.
    """
    delta = screen["delta"]
    complete = screen.get("complete")
    chosen = {(h.layer, h.head) for h in parse_heads(selected)} if selected else set()
    scale = max((abs(v) for row in delta for v in row), default=0.0)
    num_heads = len(delta[0]) if delta else 0
    wide = num_heads > 16
    blocks = []
    for first in range(0, max(1, num_heads), max_columns):
        last = min(num_heads, first + max_columns)
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 0 if wide else 1))
        table.add_column("L\\H", justify="right", style="bold")
        for h in range(first, last):
            table.add_column(str(h) if not wide or h % 4 == 0 else "", justify="right", min_width=1 if wide else 5)
        for layer, row in enumerate(delta):
            cells = []
            for h in range(first, last):
                value = row[h]
                mark = "*" if (layer, h) in chosen else ""
                stopped = complete is not None and not complete[layer][h]
                text = ("" if wide else f"{value:+.1f}") + mark + ("~" if stopped and not wide else "")
                cells.append(Text(text or " ", style=_cell_style(value, scale)))
            table.add_row(str(layer), *cells)
        blocks.append(table)
    unit = screen.get("unit", "points")
    legend = Text(f"{screen.get('method', '?')} screen, {unit}; green = ablating helps, red = hurts"
                  f"{'; * selected' if chosen else ''}{'; ~ stopped early' if complete is not None else ''}",
                  style="dim")
    return Group(*blocks, legend)


def render_validation(result: Mapping[str, Any]) -> Table:
    """The paper-style table: intact, edited, gain, relative error reduction, n, CI, McNemar; side tasks below."""
    table = Table(title=f"held-out validation of {result.get('heads') or '(no heads)'}", show_lines=False,
                  padding=(0, 1), pad_edge=False)
    # Short headers so the paper-style table fits an 80-column terminal; the caption spells them out.
    for name, justify in (("task", "left"), ("intact", "right"), ("edited", "right"), ("gain", "right"),
                          ("RER", "right"), ("n", "right"), ("95% CI", "right"), ("McNemar p", "right")):
        table.add_column(name, justify=justify, no_wrap=True)

    def add(row: Mapping[str, Any], side: bool) -> None:
        rer = row.get("relative_error_reduction")
        lo, hi = row["ci95_points"]
        gain = row["gain_points"]
        style = "green" if gain > 0 else ("red" if gain < 0 else "")
        table.add_row(
            ("side: " if side else "") + str(row["task"]), f"{100 * row['intact_acc']:.2f}",
            f"{100 * row['edited_acc']:.2f}", Text(f"{gain:+.2f}", style=style),
            "-" if rer is None else f"{100 * rer:.1f}%", str(row["n"]), f"[{lo:+.1f},{hi:+.1f}]",
            format_p(row["mcnemar_p"]).replace("p=", ""),
        )

    add(result, side=False)
    for row in result.get("side_tasks", []):
        add(row, side=True)
    table.caption = (result.get("verdict", "") + "\naccuracies in %; gain and 95% CI (paired bootstrap) in points; "
                     "RER = relative error reduction")
    return table
