"""Layer x head heatmap: fills in cell by cell as `HeadScored` events arrive.

Colour is the change in discovery accuracy on the scale the CLI and the PNG share (`headedit.colors`: green
= ablating helps, red = hurts, stepped and symmetric around 0 on ±the largest |delta| seen), explained by a
legend under the grid; selected heads carry a mark; the last line shows the numbers of the cell under the cursor.
When `editable`, space/enter toggles the cursor's head, so a hand-made set can be built on the grid.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.color import Color
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from headedit.colors import delta_rgb, ink_rgb, legend_stops, scale_max
from headedit.model.heads import Head, format_heads

LABEL_WIDTH = 5  # "L12 " + gap
LEGEND_LINES = 2  # the colour bar and what its ends mean


def cell_style(delta: float, vmax: float, bold: bool = False) -> Style:
    """A scored cell: the shared scale's colour behind, black or white ink on it."""
    bg = delta_rgb(delta, vmax)
    return Style(bgcolor=Color.from_rgb(*bg), color=Color.from_rgb(*ink_rgb(bg)), bold=bold)


class HeadHeatmap(Widget, can_focus=True):
    """A grid with one cell per attention head (rows = layers, columns = query heads)."""

    BINDINGS = [
        Binding("up", "move(-1, 0)", "Up", show=False),
        Binding("down", "move(1, 0)", "Down", show=False),
        Binding("left", "move(0, -1)", "Left", show=False),
        Binding("right", "move(0, 1)", "Right", show=False),
        Binding("space", "toggle_head", "Toggle", show=True),
    ]

    DEFAULT_CSS = """
    HeadHeatmap { height: auto; width: 1fr; min-width: 20; }
    """

    cursor: reactive[tuple[int, int]] = reactive((0, 0))

    class Toggled(Message):
        """The user toggled a head; `heads` is the new selection in canonical text."""

        def __init__(self, heatmap: "HeadHeatmap", heads: str) -> None:
            self.heatmap = heatmap
            self.heads = heads
            super().__init__()

        @property
        def control(self) -> "HeadHeatmap":
            return self.heatmap

    def __init__(
        self,
        num_layers: int = 0,
        num_heads: int = 0,
        *,
        editable: bool = False,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.editable = editable
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.scores: dict[Head, float] = {}
        self.details: dict[Head, dict[str, Any]] = {}
        self.selected: set[Head] = set()
        self.intact_acc: float | None = None

    # ---- data -------------------------------------------------------------------------------
    def set_shape(self, num_layers: int, num_heads: int) -> None:
        """(Re)size the grid; keeps scores that still fit."""
        self.num_layers, self.num_heads = num_layers, num_heads
        self.scores = {h: v for h, v in self.scores.items() if h.layer < num_layers and h.head < num_heads}
        layer, head = self.cursor
        self.cursor = (min(layer, max(num_layers - 1, 0)), min(head, max(num_heads - 1, 0)))
        self.refresh(layout=True)

    def set_score(self, layer: int, head: int, delta: float, detail: dict[str, Any] | None = None) -> None:
        """One head's result arrived (from a `HeadScored` event)."""
        if layer >= self.num_layers or head >= self.num_heads:
            self.set_shape(max(self.num_layers, layer + 1), max(self.num_heads, head + 1))
        key = Head(layer, head)
        self.scores[key] = float(delta)
        if detail:
            self.details[key] = dict(detail)
        self.refresh()

    def load_table(self, delta: list[list[float | None]]) -> None:
        """Fill from a stored screen table (`screen.json`'s `delta`, [layer][head] points)."""
        self.set_shape(len(delta), max((len(row) for row in delta), default=0))
        for layer, row in enumerate(delta):
            for head, value in enumerate(row):
                if value is not None:
                    self.scores[Head(layer, head)] = float(value)
        self.refresh()

    def set_selected(self, heads: Iterable[Head | tuple[int, int]]) -> None:
        self.selected = {Head(*h) for h in heads}
        self.refresh()

    @property
    def selection_text(self) -> str:
        return format_heads(self.selected)

    @property
    def scored(self) -> int:
        return len(self.scores)

    @property
    def scale(self) -> float:
        """±points the colours span: the largest |delta| so far (at least `headedit.colors.MIN_VMAX`)."""
        return scale_max(self.scores.values())

    # ---- geometry ---------------------------------------------------------------------------
    def _cell_width(self, width: int | None = None) -> int:
        width = self.size.width if width is None else width
        if not self.num_heads:
            return 3
        return max(1, min(4, (max(width, 1) - LABEL_WIDTH) // self.num_heads))

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return LABEL_WIDTH + self.num_heads * 4

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        summary = max(1, -(-len(self.cursor_summary()) // max(width, 1)))  # the cursor line may wrap
        return self.num_layers + 1 + LEGEND_LINES + summary  # header, one row per layer, legend, cursor line

    # ---- rendering --------------------------------------------------------------------------
    def render(self) -> Text:
        if not self.num_layers or not self.num_heads:
            return Text("no model layout yet", style="dim")
        cw = self._cell_width()
        out = Text(overflow="fold")
        out.append(" " * LABEL_WIDTH)
        for head in range(self.num_heads):
            label = str(head) if cw >= 2 or head % 5 == 0 else " "
            out.append(label.center(cw)[:cw] if cw >= len(label) else label[-cw:], style="dim")
        out.append("\n")
        scale = self.scale
        cur = Head(*self.cursor)
        focused = self.has_focus
        for layer in range(self.num_layers):
            out.append(f"L{layer}".ljust(LABEL_WIDTH - 1) + " ", style="dim")
            for head in range(self.num_heads):
                key = Head(layer, head)
                value = self.scores.get(key)
                mark = "●" if key in self.selected else ("·" if value is None else " ")
                text = mark.center(cw) if cw > 1 else mark
                if value is None:
                    style = Style(color="grey50")
                else:
                    style = cell_style(value, scale, bold=key in self.selected)
                if key == cur and (focused or self.editable):
                    text = ("[" + mark + "]").center(cw) if cw >= 3 else text
                    style = style + Style(reverse=True)
                out.append(text, style=style)
            out.append("\n")
        out.append_text(self.legend(scale))
        out.append(self.cursor_summary(), style="bold" if focused else "")
        return out

    def legend(self, vmax: float) -> Text:
        """Two lines, each cut to the widget's width: every colour step from -vmax to +vmax points, then what
        the colours mean (LEGEND_LINES; the height computation counts on neither wrapping)."""
        stops = legend_stops(vmax)
        width = max(self.size.width, 1)
        low, high = f"{-vmax:+.0f}", f"{vmax:+.0f} pts"
        swatch = 2 if len(low) + len(high) + 2 + 2 * len(stops) <= width else 1
        bar = Text(low + " ", style="dim")
        for _, _, rgb in stops:
            bar.append(" " * swatch, style=Style(bgcolor=Color.from_rgb(*rgb)))
        bar.append(" " + high, style="dim")
        meaning = Text("red hurts · green helps", style="dim")
        for line in (bar, meaning):
            line.truncate(width)
        return Text("\n").join([bar, meaning]) + "\n"

    def cursor_summary(self) -> str:
        """The numbers of the head under the cursor, as one line."""
        key = Head(*self.cursor)
        parts = [f"head {key}"]
        value = self.scores.get(key)
        parts.append("not scored yet" if value is None else f"Δ {value:+.1f} pts")
        detail = self.details.get(key, {})
        acc = detail.get("acc", detail.get("accuracy"))
        if isinstance(acc, (int, float)):
            parts.append(f"acc {acc:.3f}")
        n = detail.get("n")
        if isinstance(n, int):
            parts.append(f"n {n}")
        if detail.get("stopped_early"):
            parts.append("stopped early")
        if key in self.selected:
            parts.append("selected")
        return "  ".join(parts)

    # ---- interaction ------------------------------------------------------------------------
    def watch_cursor(self, old: tuple[int, int], new: tuple[int, int]) -> None:
        self.refresh(layout=True)  # the cursor line's length (and so its height) changes
        parent = self.parent
        if isinstance(parent, Widget) and parent.is_scrollable and self.is_mounted:
            row = Region(0, self.virtual_region.y + new[0] + 1, 1, 1)  # +1: the header row
            parent.scroll_to_region(row, animate=False, immediate=True)
        self.refresh()

    def action_move(self, d_layer: int, d_head: int) -> None:
        if not self.num_layers or not self.num_heads:
            return
        layer, head = self.cursor
        self.cursor = (min(max(layer + d_layer, 0), self.num_layers - 1),
                       min(max(head + d_head, 0), self.num_heads - 1))

    def action_toggle_head(self) -> None:  # not `action_toggle`: DOMNode's takes an attribute name
        if not self.editable or not self.num_layers:
            return
        key = Head(*self.cursor)
        self.selected.symmetric_difference_update({key})
        self.refresh()
        self.post_message(self.Toggled(self, self.selection_text))

    def on_click(self, event: events.Click) -> None:
        row, col = event.y - 1, event.x - LABEL_WIDTH
        if 0 <= row < self.num_layers and col >= 0:
            head = col // self._cell_width()
            if head < self.num_heads:
                self.cursor = (row, head)
                if event.chain == 2:
                    self.action_toggle_head()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
