"""Discovery: live stage progress, the layer×head heatmap filling in, the journal as a log, and Cancel.

The work is `headedit.pipeline.discover` in a thread worker; Cancel sets the threading.Event it polls, so
the run stops at its next checkpoint with every finished evaluation in the journal (resumable). A reopened
run shows what its files hold; they are read in `__init__`, so a corrupt file is an error modal before the
screen is pushed, never a crash.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headedit.tui.messages import PipelineEvent
from headedit.tui.screens.base import StepScreen
from headedit.tui.widgets.heatmap import HeadHeatmap
from headedit.tui.widgets.progress import StageProgressPanel
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Label, RichLog, Static

from headedit.events import HeadScored, Log, SetEvaluated, StageFinished, StageStarted

STATUS = {
    "idle": "not finished; r resumes",
    "running": "running… c cancels (the run stays resumable)",
    "cancelling": "cancelling at the next checkpoint…",
    "cancelled": "cancelled, finished evaluations kept; r resumes",
    "done": "done; enter opens the candidates",
    "failed": "stopped by an error; r resumes",
}


def read_json(path: Path) -> Any:
    # lazy: the app paints before the pipeline and its models load
    from headedit.runs import read_json as _read

    return _read(path)


def read_optional(path: Path) -> dict[str, Any]:
    """A run file's JSON object, or {} when the stage has not written it yet."""
    data = read_json(path) if path.is_file() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} holds {type(data).__name__}, not an object")
    return data


def delta_table(screen: dict[str, Any]) -> list[list[float | None]]:
    """`screen.json`'s [layer][head] points as floats (None: not scored); raises ValueError/TypeError on
    anything else, while the screen is being built."""
    return [[None if v is None else float(v) for v in row] for row in screen.get("delta") or []]


class DiscoveryScreen(StepScreen):
    BINDINGS = [
        Binding("c", "cancel", "Cancel"),
        Binding("r", "resume", "Resume"),
        Binding("enter", "candidates", "Candidates", priority=True),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, run_dir: Path, recipe: Any | None = None, layout: tuple[int, int] = (0, 0),
                 resume: bool = False, start: bool = True) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.recipe = recipe
        self.grid_shape = layout
        self.resume = resume
        self.start = start
        self.events_seen = 0
        self.selected = ""
        self.screen_table = read_optional(self.run_dir / "screen.json")
        self.search = read_optional(self.run_dir / "search.json")
        self.selection = read_optional(self.run_dir / "selection.json")
        self.delta = delta_table(self.screen_table)
        self.state = "done" if self.selection else "idle"  # idle | running | cancelling | cancelled | done | failed

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="discovery"):
            with Vertical(id="discovery-left"):
                yield Static("", id="run-status", markup=False)
                yield StageProgressPanel("waiting for the first stage…", id="stages")
                yield Label("Journal", classes="section")
                yield RichLog(id="journal", max_lines=500, wrap=True, min_width=1, markup=False, auto_scroll=True)
            with VerticalScroll(id="heatmap-box"):
                yield Label("Δ accuracy per head (pts)", classes="section")
                yield HeadHeatmap(*self.grid_shape, id="heatmap")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"discovery · {self.run_dir.name}"
        self.show_existing()
        if self.start:
            self.start_discovery(resume=self.resume)
        else:
            self.query_one(StageProgressPanel).placeholder = (
                "every stage finished (summary below)" if self.state == "done" else "r resumes the unfinished stages")
            self.set_state(self.state)

    # ---- state ------------------------------------------------------------------------------
    def show_existing(self) -> None:
        """A reopened run shows what its files already hold: the heatmap, the selection, a summary."""
        if self.delta:
            self.query_one(HeadHeatmap).load_table(self.delta)
        if not self.selection:
            return
        self.show_selection(self.selection)
        log = self.query_one("#journal", RichLog)
        screen, search = self.screen_table, self.search
        if screen:
            log.write(f"screen ({screen.get('method', '?')}): {screen.get('evaluations', '?')} heads, "
                      f"n {screen.get('n', '?')}, intact acc {float(screen.get('intact_acc', 0)):.3f}")
        if search:
            log.write(f"search: {search.get('evaluations', len(search.get('trace', [])))} sets tried")
        gain = self.selection.get("gain_points")
        log.write(f"selected {self.selected or '(none)'}" + ("" if gain is None else f": {float(gain):+.1f} pts"))

    def show_selection(self, selection: dict[str, Any]) -> None:
        # lazy: the app paints before the pipeline and its models load
        from headedit.model.heads import parse_heads

        self.query_one(HeadHeatmap).set_selected(parse_heads(selection.get("heads", "")))
        self.selected = selection.get("heads", "")

    def set_state(self, state: str, detail: str = "") -> None:
        self.state = state
        self.query_one("#run-status", Static).update(f"{STATUS[state]}{detail}")
        self.refresh_bindings()  # the footer offers only what this state allows

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.state == "running"
        if action == "resume":
            return self.state in ("idle", "cancelled", "failed")
        if action == "candidates":
            return self.state == "done"
        return True

    # ---- work -------------------------------------------------------------------------------
    def start_discovery(self, resume: bool) -> None:
        self.cancel_event.clear()
        self.set_state("running")
        self.run_discover(resume)

    @work(thread=True, exclusive=True, exit_on_error=False, group="discover", name="discover")
    def run_discover(self, resume: bool) -> Path:
        # lazy: the app paints before the pipeline and its models load
        from headedit.pipeline import discover

        if resume:
            return discover(None, run_dir=self.run_dir, resume=True, reporter=self.reporter, cancel=self.cancel_event)
        return discover(self.recipe, run_dir=self.run_dir, resume=False, reporter=self.reporter,
                        cancel=self.cancel_event)

    def worker_done(self, name: str, result: Any) -> None:
        if name != "discover":
            return
        selection_file = self.run_dir / "selection.json"
        if self.cancel_event.is_set() or not selection_file.is_file():
            self.set_state("cancelled")
            return
        self.selection = read_json(selection_file)
        self.show_selection(self.selection)
        self.set_state("done", f" · selected {self.selected or '(none)'}")
        self.app.run_finished(self.run_dir)  # type: ignore[attr-defined]

    def worker_failed(self, name: str, error: BaseException | None) -> None:
        if name == "discover" and (error is None or self.cancel_event.is_set()):
            self.set_state("cancelled")
            return
        self.set_state("failed")
        super().worker_failed(name, error)

    @on(PipelineEvent)
    def pipeline_event(self, message: PipelineEvent) -> None:
        event = message.event
        self.events_seen += 1
        log = self.query_one("#journal", RichLog)
        if isinstance(event, HeadScored):
            self.query_one(HeadHeatmap).set_score(event.layer, event.head, event.delta, event.detail)
        elif isinstance(event, SetEvaluated):
            cached = " (journal)" if event.cached else ""
            log.write(f"{event.stage}: {event.heads or '(intact)'} acc {event.accuracy:.3f} n {event.n}{cached}")
        elif isinstance(event, Log):
            log.write(("! " if event.level in ("warning", "error") else "") + event.message)
        elif isinstance(event, (StageStarted, StageFinished)):
            self.query_one(StageProgressPanel).handle(event)
            if isinstance(event, StageFinished) and event.summary:
                log.write(f"{event.stage}: {event.summary}")
        else:
            self.query_one(StageProgressPanel).handle(event)

    # ---- actions ----------------------------------------------------------------------------
    def action_cancel(self) -> None:
        if self.state == "running":
            self.cancel_event.set()
            self.set_state("cancelling")

    def action_resume(self) -> None:
        if self.state in ("cancelled", "failed", "idle"):
            self.start_discovery(resume=True)

    def action_candidates(self) -> None:
        if self.state == "done":
            self.app.open_candidates(self.run_dir)  # type: ignore[attr-defined]
        else:
            self.notify("discovery has not finished yet", timeout=2)

    def action_back(self) -> None:
        if self.state in ("running", "cancelling"):
            self.notify("cancel the run first (c)", timeout=2)
            return
        self.app.pop_screen()
