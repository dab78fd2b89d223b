"""Candidates: the search trace as a sortable table; accept the search's choice, pick another row, or
toggle heads on the heatmap to make a set by hand and have it evaluated on demand (discovery split)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headedit.tui.messages import PipelineEvent
from headedit.tui.screens.base import StepScreen
from headedit.tui.screens.discovery import delta_table, read_json, read_optional
from headedit.tui.widgets.candidates import HAND_MARK, LEGEND, SEARCH_MARK, CandidateTable
from headedit.tui.widgets.head_input import HeadSetInput
from headedit.tui.widgets.heatmap import HeadHeatmap
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Header, Input, Label, Static

from headedit.errors import HeadeditError
from headedit.model.heads import HeadLayout, format_heads, parse_heads


class CandidatesScreen(StepScreen):
    # one-letter keys work while the head-set box has focus: HeadSetInput types only head-set characters
    BINDINGS = [
        Binding("a", "accept", "Search's choice"),
        Binding("e", "evaluate", "Evaluate"),
        Binding("b", "bake", "Bake"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, run_dir: Path, compare: str | None = None) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.compare = compare
        screen = read_optional(self.run_dir / "screen.json")
        search = read_optional(self.run_dir / "search.json")
        selection = read_json(self.run_dir / "selection.json")
        self.delta = delta_table(screen)
        self.trace = [dict(entry, heads=str(entry["heads"])) for entry in search.get("trace", [])]
        # the search's own choice (a hand-made selection keeps it under search_heads)
        self.chosen: str = selection.get("search_heads", selection.get("heads", "")) or ""
        self.intact_acc: float | None = selection.get("intact_acc", screen.get("intact_acc"))
        full_n = selection.get("n", screen.get("n"))  # the discovery split's size: rows without their own n
        self.full_n: int | None = int(full_n) if isinstance(full_n, (int, float)) else None
        self.num_layers = int(screen.get("num_layers") or len(self.delta))
        self.num_heads = int(screen.get("num_heads") or max((len(r) for r in self.delta), default=0))
        self.current: str = selection.get("heads", "") or ""

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="candidates"):
            with Vertical(id="candidates-left"):
                yield Label("Search trace (s sorts, enter takes a row)", classes="section")
                yield CandidateTable(id="trace")
                yield Static(LEGEND, id="trace-legend", markup=False)
                with Horizontal(classes="field"):
                    yield Label("Head set", classes="field-label")
                    yield HeadSetInput(self.current, id="set", placeholder="e.g. 0.1,1.2 (empty = intact)")
                yield Static("", id="set-error", classes="field-error", markup=False)
                yield Static("", id="set-summary", markup=False)
            with VerticalScroll(id="heatmap-box"):
                yield Label("space toggles a head", classes="section")
                yield HeadHeatmap(self.num_layers, self.num_heads, editable=True, id="heatmap")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"candidates · {self.run_dir.name}"
        heatmap = self.query_one(HeadHeatmap)
        heatmap.load_table(self.delta)
        table = self.query_one(CandidateTable)
        table.load_trace(self.trace, chosen=self.chosen, full_n=self.full_n)
        if self.compare:
            self.query_one("#set", Input).value = self.compare
            self.use_set(self.compare)
        else:
            self.use_set(self.current)
        table.focus()

    # ---- the current set --------------------------------------------------------------------
    def use_set(self, text: str) -> bool:
        """Make `text` the current set if it parses against the model; otherwise mark the input."""
        try:
            heads = parse_heads(text, self._layout())
        except HeadeditError as err:
            self.query_one("#set-error", Static).update(str(err))
            self.query_one("#set-error").set_class(True, "shown")
            self.query_one("#set", Input).set_class(True, "invalid")
            return False
        self.query_one("#set-error", Static).update("")
        self.query_one("#set-error").set_class(False, "shown")
        self.query_one("#set", Input).set_class(False, "invalid")
        self.current = format_heads(heads)
        self.query_one(HeadHeatmap).set_selected(heads)
        self.update_summary()
        return True

    def _layout(self) -> Any:
        """Bounds for head text: the run's grid (layers × heads) is all parse_heads needs to range-check."""
        if self.num_layers and self.num_heads:
            return HeadLayout.uniform("llama", "this model", self.num_layers, self.num_heads, self.num_heads, 1,
                                      self.num_heads)
        return None

    def update_summary(self) -> None:
        row = self.query_one(CandidateTable).rows_data.get(self.current)
        label = "search's choice" if self.current == self.chosen else "hand-made"
        numbers = ""
        if row and row.get("acc") is not None:
            gain = "" if row.get("gain") is None else f", {row['gain']:+.1f} pts"
            n = "" if row.get("n") is None else f", n {row['n']}"
            numbers = f": acc {row['acc']:.3f}{gain}{n}"
        elif self.current != self.chosen:
            numbers = ": not evaluated (e)"
        self.query_one("#set-summary", Static).update(f"{self.current or '(intact)'} ({label}){numbers}")

    @on(DataTable.RowSelected, "#trace")
    def row_selected(self, event: DataTable.RowSelected) -> None:
        heads = event.row_key.value or ""
        self.query_one("#set", Input).value = heads
        self.use_set(heads)

    @on(Input.Submitted, "#set")
    def set_submitted(self, event: Input.Submitted) -> None:
        self.use_set(event.value)

    @on(Input.Changed, "#set")
    def set_changed(self, event: Input.Changed) -> None:
        if event.value.strip() == self.current:
            return
        self.use_set(event.value)

    @on(HeadHeatmap.Toggled)
    def heatmap_toggled(self, event: HeadHeatmap.Toggled) -> None:
        with self.prevent(Input.Changed):
            self.query_one("#set", Input).value = event.heads
        self.use_set(event.heads)

    # ---- actions ----------------------------------------------------------------------------
    def action_accept(self) -> None:
        self.query_one("#set", Input).value = self.chosen
        self.use_set(self.chosen)

    def action_evaluate(self) -> None:
        if not self.use_set(self.query_one("#set", Input).value):
            return
        self.query_one("#set-summary", Static).update(f"evaluating {self.current or '(intact)'}…")
        self.evaluate(self.current)

    @work(thread=True, exclusive=True, exit_on_error=False, group="evaluate", name="evaluate")
    def evaluate(self, heads: str) -> tuple[str, float]:
        # lazy: the app paints before the pipeline and its models load
        from headedit.pipeline import evaluate_set

        return heads, float(evaluate_set(self.run_dir, heads, reporter=self.reporter))

    def worker_done(self, name: str, result: Any) -> None:
        if name == "evaluate":
            heads, acc = result
            gain = None if self.intact_acc is None else (acc - self.intact_acc) * 100
            size = len(parse_heads(heads)) if heads else 0
            table = self.query_one(CandidateTable)
            note = SEARCH_MARK if heads == self.chosen else HAND_MARK
            table.add_set(heads, size, acc, gain, note=note, n=self.full_n)
            self.update_summary()

    @on(PipelineEvent)
    def pipeline_event(self, message: PipelineEvent) -> None:
        pass  # evaluation progress is short; the summary line says what is running

    def action_bake(self) -> None:
        if not self.use_set(self.query_one("#set", Input).value):
            return
        if not self.current:
            self.notify("the empty set is the intact model: pick at least one head", severity="warning")
            return
        self.app.open_bake(self.run_dir, self.current)  # type: ignore[attr-defined]

    def action_back(self) -> None:
        self.app.pop_screen()
