"""Rich renderings for the CLI: the screen heatmap and the validation table.

Progress reporters live in `headedit.commands.progress` (re-exported here as `rich_reporter` for the commands
that import it from this module). Tables fit the console's width by shortening labels and never numbers.
Nothing here is imported by the library itself.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from headedit.colors import delta_rgb, ink_rgb, scale_max
from headedit.commands.progress import reporter_for, rich_reporter
from headedit.export.removal_card import selectivity_line
from headedit.model.heads import parse_heads
from headedit.stats import format_p


def _cell_style(value: float, vmax: float) -> str:
    """The shared diverging scale (headedit.colors): green = ablating helps, red = hurts, grey = no change."""
    bg = delta_rgb(value, vmax)
    fg = ink_rgb(bg)
    return f"rgb({fg[0]},{fg[1]},{fg[2]}) on rgb({bg[0]},{bg[1]},{bg[2]})"


def render_heatmap(screen: Mapping[str, Any], selected: str = "", max_columns: int = 64) -> Any:
    """Layer x head table of the screen's deltas (rows = layers); selected heads marked with '*'.

    Wide models are shown in blocks of `max_columns` heads so the table fits a terminal.
    """
    delta = screen["delta"]
    complete = screen.get("complete")
    chosen = {(h.layer, h.head) for h in parse_heads(selected)} if selected else set()
    vmax = scale_max(v for row in delta for v in row)
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
                cells.append(Text(text or " ", style=_cell_style(value, vmax)))
            table.add_row(str(layer), *cells)
        blocks.append(table)
    unit = screen.get("unit", "points")
    effect = "green = ablating removes more, red = less" if screen.get("direction") == "remove" else \
        "green = ablating helps, red = hurts"  # remove direction: the screen scores the target's drop
    legend = Text(f"{screen.get('method', '?')} screen, {unit}; {effect}"
                  f"{'; * selected' if chosen else ''}{'; ~ stopped early' if complete is not None else ''}",
                  style="dim")
    return Group(*blocks, legend)


def _p_cell(p: float) -> str:
    """format_p without its `p`: `< 1e-300`, `1.2e-05`, `0.0123`."""
    return format_p(p).removeprefix("p=").removeprefix("p ")


@dataclass(frozen=True)
class _Labels:
    """One way to label the table: full words for a wide terminal, shorter ones when it is narrow."""

    p_header: str
    side_prefix: str
    table_box: box.Box | None
    padding: tuple[int, int, int, int] = (0, 1, 0, 1)
    show_edge: bool = True


MIN_TASK = 10  # narrowest task column worth folding into; below it the table becomes lines
_LABELS = (
    _Labels("McNemar p", "side: ", box.HEAVY_HEAD),
    _Labels("McNemar p", "side: ", box.SIMPLE_HEAD, (0, 0, 0, 1), False),  # no frame: 9 columns saved
    _Labels("p", "side ", box.SIMPLE_HEAD, (0, 0, 0, 1), False),
)


def damage_text(damage: Mapping[str, Any] | None) -> str:
    """The general-damage figure in words, or '' when the run has none."""
    if not damage or not isinstance(damage.get("kl_mean"), (int, float)):
        return ""
    return (f"general damage: {damage.get('direction', 'KL(intact || edited)')} of next-token distributions on "
            f"neutral text = {float(damage['kl_mean']):.4f} nats/token (max {float(damage.get('kl_max', 0.0)):.3f}, "
            f"{damage.get('tokens', '?')} tokens)")


class FitTable:
    """A renderable that shows the first of several tables whose natural width fits the console.

    `tables` go from the most to the least spelled out; each builder shortens labels, never numbers (number
    columns are `no_wrap`). When none fits, the last one is still used if its label column (`label_column`)
    keeps `MIN_TASK` characters by folding; otherwise `fallback()` (e.g. one line per row) is shown.
    """

    def __init__(self, tables: Sequence[Callable[[], Table]], fallback: Callable[[], Any] | None = None,
                 label_column: int = 0) -> None:
        self.tables = tables
        self.fallback = fallback
        self.label_column = label_column

    def choose(self, console: Console, options: ConsoleOptions) -> Any:
        wide = options.update(max_width=10_000)
        table = None
        for build in self.tables:
            table = build()
            if Measurement.get(console, wide, table).maximum <= options.max_width:
                return table
        assert table is not None
        labels = [str(cell) for cell in table.columns[self.label_column].cells]
        label_width = max((len(c) for c in labels), default=0)
        if self.fallback is None or Measurement.get(console, wide, table).maximum - label_width + MIN_TASK <= options.max_width:
            return table
        return self.fallback()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.choose(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.choose(console, options))


class ValidationTable(FitTable):
    """The paper-style table (intact, edited, gain, RER, n, CI, McNemar; side tasks below) that fits its width;
    on a terminal too narrow even for the compact table, the same figures as one line per task."""

    def __init__(self, result: Mapping[str, Any]) -> None:
        self.result = result
        super().__init__([partial(self.table, labels) for labels in _LABELS], self.lines)

    def table(self, labels: _Labels) -> Table:
        result = self.result
        table = Table(title=f"held-out validation of {result.get('heads') or '(no heads)'}", show_lines=False,
                      padding=labels.padding, pad_edge=False, box=labels.table_box, show_edge=labels.show_edge)
        table.add_column("task", justify="left", overflow="fold")
        for name in ("intact", "edited", "gain", "RER", "n", "95% CI", labels.p_header):
            table.add_column(name, justify="right", no_wrap=True)

        def add(row: Mapping[str, Any], side: bool) -> None:
            rer = row.get("relative_error_reduction")
            lo, hi = row["ci95_points"]
            gain = row["gain_points"]
            style = "green" if gain > 0 else ("red" if gain < 0 else "")
            prefix = labels.side_prefix.replace("side", "retain") if row.get("retain") else labels.side_prefix
            table.add_row(
                (prefix if side else "") + str(row["task"]), f"{100 * row['intact_acc']:.2f}",
                f"{100 * row['edited_acc']:.2f}", Text(f"{gain:+.2f}", style=style),
                "-" if rer is None else f"{100 * rer:.1f}%", str(row["n"]), f"[{lo:+.1f},{hi:+.1f}]",
                _p_cell(row["mcnemar_p"]),
            )

        add(result, side=False)
        for row in result.get("side_tasks", []):
            add(row, side=True)
        table.caption = "\n".join(self.caption(labels.p_header == "p"))
        return table

    def caption(self, short_p: bool) -> list[str]:
        lines = [str(self.result.get("verdict", "")),
                 "accuracies in %; gain and 95% CI (paired bootstrap) in points; RER = relative error reduction"
                 + ("; p = exact McNemar" if short_p else ""),
                 damage_text(self.result.get("damage")), selectivity_line(self.result)]
        return [line for line in lines if line]

    def lines(self) -> Group:
        """The same figures as `key value` lines: a terminal too narrow for the table still gets every digit."""
        out: list[Text] = [Text(f"held-out validation of {self.result.get('heads') or '(no heads)'}", style="italic")]
        for side, row in [(False, self.result)] + [(True, r) for r in self.result.get("side_tasks", [])]:
            rer = row.get("relative_error_reduction")
            lo, hi = row["ci95_points"]
            out.append(Text(
                f"{('retain: ' if row.get('retain') else 'side: ') if side else ''}{row['task']}: intact {100 * row['intact_acc']:.2f}, edited "
                f"{100 * row['edited_acc']:.2f}, gain {row['gain_points']:+.2f}, RER "
                f"{'-' if rer is None else f'{100 * rer:.1f}%'}, n {row['n']}, 95% CI [{lo:+.1f},{hi:+.1f}], "
                f"McNemar p {_p_cell(row['mcnemar_p'])}"))
        out.extend(Text(line, style="dim") for line in self.caption(short_p=False))
        return Group(*out)


def render_validation(result: Mapping[str, Any]) -> ValidationTable:
    """The validation table as a renderable that fits the console it is printed on."""
    return ValidationTable(result)


__all__ = [
    "FitTable",
    "ValidationTable",
    "damage_text",
    "render_heatmap",
    "render_validation",
    "reporter_for",
    "rich_reporter",
]
