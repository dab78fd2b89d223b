"""The one colour scale (`headedit.colors`) and the TUI heatmap under a 256-colour terminal: the README demo's
+14.1, +3.0 and -3.2 used to come out in one grey; they must be three colours, and the legend every step."""
from __future__ import annotations

import re

import pytest
from headedit.tui.widgets.heatmap import LABEL_WIDTH, HeadHeatmap
from rich.color import Color, ColorSystem
from textual.app import App, ComposeResult
from textual.geometry import Region

from headedit import colors
from headedit.model.heads import Head

DEMO_DELTA = [[95.5, -3.2, 89.3, -3.2], [0.7, -0.1, 14.1, 3.0]]  # the README's demo screen, points
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def xterm256(rgb: tuple[int, int, int]) -> int:
    number = Color.from_rgb(*rgb).downgrade(ColorSystem.EIGHT_BIT).number
    assert number is not None
    return number


def test_scale_is_diverging_symmetric_and_in_points() -> None:
    vmax = colors.scale_max(v for row in DEMO_DELTA for v in row)
    assert vmax == 95.5 and colors.scale_max([0.1, None, float("nan")]) == colors.MIN_VMAX
    for points in (0.3, 3.0, 14.1, 40.0, 95.5):
        assert colors.level(points, vmax) == -colors.level(-points, vmax) > 0  # symmetric around 0
        green, red = colors.delta_rgb(points, vmax), colors.delta_rgb(-points, vmax)
        assert green[1] > green[0] and red[0] > red[1]  # green = ablating helps, red = hurts
    assert colors.delta_rgb(0.0, vmax) == colors.delta_rgb(0.04, vmax) == colors.NEUTRAL
    steps = [colors.level(p, vmax) for p in (0.1, 3.0, 14.1, 30.0, 50.0, 95.5, 500.0)]
    assert steps == sorted(steps) and steps[-1] == colors.LEVELS  # monotone, saturates at vmax


def test_legend_stops_cover_the_scale_and_match_delta_rgb() -> None:
    vmax = 95.5
    stops = colors.legend_stops(vmax)
    assert len(stops) == 2 * colors.LEVELS + 1
    assert stops[0][0] == -vmax and stops[-1][1] == vmax
    assert all(a[1] == pytest.approx(b[0]) for a, b in zip(stops, stops[1:], strict=False))  # contiguous
    for low, high, rgb in stops:
        assert colors.delta_rgb((low + high) / 2, vmax) == rgb


def test_every_step_is_its_own_xterm_256_colour() -> None:
    rgbs = [rgb for _, _, rgb in colors.legend_stops(95.5)]
    assert len({xterm256(rgb) for rgb in rgbs}) == len(rgbs)
    assert len({xterm256(colors.delta_rgb(v, 95.5)) for v in (14.1, 3.0, -3.2)}) == 3
    for rgb in rgbs:  # readable ink on every step
        assert colors.ink_rgb(rgb) in ((0, 0, 0), (255, 255, 255))


class HeatmapApp(App):
    def compose(self) -> ComposeResult:
        yield HeadHeatmap(2, 4)


def background_codes(ansi: str) -> list[str | None]:
    """The background SGR code of every cell of one rendered line ('5;71' = xterm colour 71)."""
    cells: list[str | None] = []
    bg: str | None = None
    for i, part in enumerate(SGR.split(ansi)):
        if i % 2:  # an SGR parameter list
            params = part.split(";") if part else ["0"]
            j = 0
            while j < len(params):
                if params[j] in ("0", "49"):
                    bg = None
                elif params[j] == "48":
                    kind = params[j + 1]
                    width = 2 if kind == "5" else 4
                    bg = ";".join(params[j + 1:j + width + 1])
                    j += width
                j += 1
        else:
            cells += [bg] * len(part)
    return cells


@pytest.mark.anyio
async def test_heatmap_under_256_colours_shows_distinct_colours_and_a_legend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import textual.constants

    monkeypatch.setattr(textual.constants, "COLOR_SYSTEM", "256")  # Textual's colour-system setting
    app = HeatmapApp()
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.console.color_system == "256"
        heatmap = app.query_one(HeadHeatmap)
        heatmap.load_table(DEMO_DELTA)
        heatmap.cursor = (0, 3)  # the cursor cell is drawn reversed: keep it off the cells under test
        await pilot.pause()
        width, height = heatmap.size
        # the bytes Textual writes to the terminal for each line of the widget
        lines = [strip.render(app.console) for strip in heatmap.render_lines(Region(0, 0, width, height))]
        assert not any("48;2;" in line for line in lines), "truecolor escapes on a 256-colour terminal"
        cw = heatmap._cell_width()

        def cell(head: Head) -> str | None:
            return background_codes(lines[1 + head.layer])[LABEL_WIDTH + head.head * cw]

        shown = {value: cell(Head(layer, head)) for layer, head, value in ((1, 2, 14.1), (1, 3, 3.0), (0, 1, -3.2))}
        assert len(set(shown.values())) == 3, shown
        assert shown[14.1] == f"5;{xterm256(colors.delta_rgb(14.1, 95.5))}"
        assert shown[3.0] == f"5;{xterm256(colors.delta_rgb(3.0, 95.5))}"
        assert shown[-3.2] == f"5;{xterm256(colors.delta_rgb(-3.2, 95.5))}"
        neutral = f"5;{xterm256(colors.NEUTRAL)}"
        assert neutral not in shown.values()

        # the legend: every step of the scale in order, between the scale's ends in points
        legend = lines[1 + 2]
        text = heatmap.legend(heatmap.scale).plain.splitlines()
        assert text[0].startswith("-96 ") and text[0].endswith("+96 pts")
        assert "red hurts · green helps" in text[1]
        codes = background_codes(legend)
        swatches = codes[len("-96 "):len(text[0]) - len(" +96 pts")]
        distinct = list(dict.fromkeys(swatches))
        assert len(swatches) == len(distinct) * (len(swatches) // len(distinct))  # equal widths
        assert distinct == [f"5;{xterm256(rgb)}" for _, _, rgb in colors.legend_stops(95.5)]
