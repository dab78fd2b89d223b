"""Widget behaviour: the heatmap fills in from HeadScored events sent from a worker thread, the progress
panel counts, the candidate table sorts by value."""
from __future__ import annotations

import threading

import pytest
from headedit.tui.messages import PipelineEvent, reporter_for
from headedit.tui.widgets.candidates import HAND_MARK, SEARCH_MARK, CandidateTable
from headedit.tui.widgets.heatmap import HeadHeatmap
from headedit.tui.widgets.progress import StageProgressPanel
from textual.app import App, ComposeResult

from headedit.events import HeadScored, Log, StageFinished, StageProgress, StageStarted
from headedit.model.heads import Head

pytestmark = pytest.mark.anyio


class HeatmapApp(App):
    def __init__(self, editable: bool = False) -> None:
        super().__init__()
        self.editable = editable
        self.toggles: list[str] = []

    def compose(self) -> ComposeResult:
        yield HeadHeatmap(3, 4, editable=self.editable, id="map")
        yield StageProgressPanel(id="progress")

    def on_pipeline_event(self, message: PipelineEvent) -> None:
        event = message.event
        if isinstance(event, HeadScored):
            self.query_one(HeadHeatmap).set_score(event.layer, event.head, event.delta, event.detail)
        else:
            self.query_one(StageProgressPanel).handle(event)

    def on_head_heatmap_toggled(self, message: HeadHeatmap.Toggled) -> None:
        self.toggles.append(message.heads)


async def test_heatmap_fills_from_events_posted_by_a_thread() -> None:
    app = HeatmapApp()
    async with app.run_test(size=(80, 24)) as pilot:
        heatmap = app.query_one(HeadHeatmap)
        assert heatmap.scored == 0
        report = reporter_for(app)
        deltas = {(layer, h): (layer * 4 + h - 5) * 1.5 for layer in range(3) for h in range(4)}

        def work() -> None:  # the library calls its reporter from a worker thread
            report(StageStarted("screen:single", total=12))
            for i, ((layer, h), d) in enumerate(deltas.items()):
                report(HeadScored("screen:single", layer, h, d, {"acc": 0.5, "n": 100}))
                report(StageProgress("screen:single", i + 1, 12))
            report(StageFinished("screen:single", "12 heads"))

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        await pilot.pause()
        assert heatmap.scored == 12
        assert {tuple(k): v for k, v in heatmap.scores.items()} == deltas
        panel = app.query_one(StageProgressPanel)
        state = panel.stages["screen:single"]
        assert (state.done, state.total, state.finished) == (12, 12, True)
        # the cursor line shows the numbers of the cell under it
        heatmap.focus()
        await pilot.press("down", "right", "right")
        assert heatmap.cursor == (1, 2)
        assert heatmap.cursor_summary() == f"head 1.2  Δ {deltas[(1, 2)]:+.1f} pts  acc 0.500  n 100"
        # moving past the edge stays on the grid
        await pilot.press("down", "down", "down", "right", "right", "right")
        assert heatmap.cursor == (2, 3)


async def test_heatmap_toggle_builds_a_hand_made_set() -> None:
    app = HeatmapApp(editable=True)
    async with app.run_test(size=(80, 24)) as pilot:
        heatmap = app.query_one(HeadHeatmap)
        heatmap.focus()
        await pilot.press("space", "right", "down", "space", "right", "space", "space")
        await pilot.pause()
        assert heatmap.selection_text == "0.0,1.1"
        assert app.toggles == ["0.0", "0.0,1.1", "0.0,1.1,1.2", "0.0,1.1"]


async def test_heatmap_read_only_ignores_toggle_and_marks_selection() -> None:
    app = HeatmapApp(editable=False)
    async with app.run_test(size=(80, 24)) as pilot:
        heatmap = app.query_one(HeadHeatmap)
        heatmap.set_selected([Head(2, 1)])
        heatmap.focus()
        await pilot.press("space")
        assert heatmap.selection_text == "2.1" and app.toggles == []
        heatmap.cursor = (2, 1)
        assert heatmap.cursor_summary().endswith("selected")
        assert "●" in str(heatmap.render())


async def test_heatmap_grows_and_loads_table() -> None:
    app = HeatmapApp()
    async with app.run_test(size=(80, 24)):
        heatmap = app.query_one(HeadHeatmap)
        heatmap.set_score(5, 7, 2.0)
        assert (heatmap.num_layers, heatmap.num_heads) == (6, 8)
        heatmap.load_table([[1.0, None], [-2.0, 0.0]])
        assert (heatmap.num_layers, heatmap.num_heads) == (2, 2)
        assert heatmap.scores == {Head(0, 0): 1.0, Head(1, 0): -2.0, Head(1, 1): 0.0}


def test_eta_from_rate() -> None:
    panel = StageProgressPanel()
    times = iter([0.0, 10.0, 10.0])
    panel.clock = lambda: next(times)
    panel.stages.clear()
    # no app: handle() only refreshes, which is a no-op for an unmounted widget
    panel.handle(StageStarted("search", total=100))
    panel.handle(StageProgress("search", 25, 100))
    assert panel.stages["search"].eta(10.0) == pytest.approx(30.0)
    assert panel.handle(Log("hello")) is False


class TableApp(App):
    def compose(self) -> ComposeResult:
        yield CandidateTable()


async def test_candidate_table_sorts_by_value() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(CandidateTable)
        trace = [
            {"heads": "0.1", "size": 1, "acc": 0.50, "gain": 10.0},
            {"heads": "0.1,0.3", "size": 2, "acc": 0.90, "gain": 50.0},
            {"heads": "0.1,0.3,1.2", "size": 3, "acc": 0.85, "gain": 45.0},
        ]
        table.load_trace(trace, chosen="0.1,0.3")
        assert table.ordered_heads == ["0.1,0.3", "0.1,0.3,1.2", "0.1"]  # by gain, best first
        assert table.get_cell("0.1,0.3", "note") == SEARCH_MARK
        table.focus()
        await pilot.press("s")  # size
        assert table.ordered_heads == ["0.1,0.3,1.2", "0.1,0.3", "0.1"]
        await pilot.press("r")
        assert table.ordered_heads == ["0.1", "0.1,0.3", "0.1,0.3,1.2"]
        table.add_set("1.0", 1, None, None, note=HAND_MARK)
        await pilot.press("s")  # acc, descending, unevaluated last
        assert table.ordered_heads[-1] == "1.0"
        assert table.ordered_heads[0] == "0.1,0.3"
        assert table.cursor_heads in table.rows_data


class BigHeatmapApp(App):
    def compose(self) -> ComposeResult:
        from textual.containers import VerticalScroll

        with VerticalScroll(id="box"):
            yield HeadHeatmap(36, 16, editable=True)


async def test_heatmap_of_a_large_model_fits_80_columns_and_follows_the_cursor() -> None:
    app = BigHeatmapApp()
    async with app.run_test(size=(80, 24)) as pilot:
        heatmap = app.query_one(HeadHeatmap)
        box = app.query_one("#box")
        assert heatmap.size.width <= 80 and heatmap._cell_width() >= 4
        lines = str(heatmap.render()).splitlines()
        # header, 36 layers, the two legend lines, the cursor line
        assert len(lines) == 1 + 36 + 2 + 1 and all(len(line) <= heatmap.size.width for line in lines[:-1])
        heatmap.focus()
        await pilot.press(*["down"] * 30)
        await pilot.pause()
        assert heatmap.cursor == (30, 0)
        assert box.scroll_y > 0
        row_y = heatmap.virtual_region.y + 30 + 1
        assert box.scroll_y <= row_y < box.scroll_y + box.size.height
