"""Bake and validate: the chosen set is baked, the checkpoint reloaded and scored on the held-out split
(never seen by discovery) and on the side tasks; the paper-style table with intervals and the verdict."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headedit.tui.messages import PipelineEvent
from headedit.tui.screens.base import StepScreen
from headedit.tui.screens.discovery import read_json
from headedit.tui.widgets.progress import StageProgressPanel
from rich import box
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Header, Label, Static

from headedit.events import Log


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f}"


def _p(x: Any) -> str:
    if x is None:
        return "—"
    x = float(x)
    return "<1e-300" if x <= 1e-300 else (f"{x:.2g}" if x < 0.001 else f"{x:.3f}")


def results_table(validation: dict[str, Any]) -> Table:
    """Task, intact, edited, gain, relative error reduction, n, 95% CI, McNemar p: target then side tasks."""
    # one space of padding plus the separator between columns: 8 columns fit 78 cells with a 16-character task
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("task", "left"), ("intact", "right"), ("edited", "right"), ("gain", "right"),
        ("RER", "right"), ("n", "right"), ("95% CI", "right"), ("p", "right"))
    for name, justify in columns:
        # numbers never wrap; the task column has the rest of the width (side tasks fit 80 columns)
        table.add_column(name, justify=justify, no_wrap=name != "task")
    rows = [dict(validation, role="target")] + [dict(s, role="side") for s in validation.get("side_tasks", [])]
    for row in rows:
        ci = row.get("ci95_points")
        gain = row.get("gain_points")
        rer = row.get("relative_error_reduction")
        style = "green" if (gain or 0) > 0 else ("red" if (gain or 0) < 0 else "")
        table.add_row(
            ("" if row["role"] == "target" else "retain: " if row.get("retain") else "side: ") + str(row.get("task", "?")),
            _pct(row.get("intact_acc")), _pct(row.get("edited_acc")),
            Text("—" if gain is None else f"{gain:+.1f}", style=style),
            "—" if rer is None else f"{100 * rer:.0f}%",
            str(row.get("n", "—")),
            "—" if not ci else f"[{ci[0]:+.1f},{ci[1]:+.1f}]",
            _p(row.get("mcnemar_p")),
        )
    return table


def record_choice(run_dir: Path, heads: str, reporter: Any) -> None:
    """Make `heads` the run's selection; the library keeps the search's own choice on record."""
    # lazy: the app paints before the pipeline and its models load
    from headedit import pipeline

    pipeline.select(run_dir, heads, reporter=reporter)


class BakeValidateScreen(StepScreen):
    BINDINGS = [
        Binding("p", "publish", "Publish"),
        Binding("c", "cancel", "Cancel"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, run_dir: Path, heads: str | None = None, start: bool = True) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.heads = heads
        self.start = start
        self.validation: dict[str, Any] | None = None
        self.running = False
        existing = self.run_dir / "validation.json"  # read here: a corrupt file is a modal, not a crash
        self.existing: dict[str, Any] | None = read_json(existing) if existing.is_file() else None

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="bake"):
            yield Static("", id="bake-status", markup=False)
            yield StageProgressPanel(id="stages")
            yield Label("Held-out validation", classes="section")
            yield Static("", id="results")
            yield Static("", id="verdict", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"bake & validate · {self.run_dir.name}"
        if self.existing is not None and (self.heads is None or self.existing.get("heads") == self.heads):
            self.show(self.existing)
        elif self.start:
            self.status(f"baking {self.heads} and validating on the held-out split…")
            self.set_running(True)
            self.run_validation(self.heads)

    def set_running(self, running: bool) -> None:
        self.running = running
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.running
        if action == "publish":  # a set that did not pass is not exported unforced: shown, greyed out
            if self.validation is None or self.running:
                return False
            return True if self.validation.get("passed") is True else None
        return True

    def status(self, text: str) -> None:
        self.query_one("#bake-status", Static).update(text)

    @work(thread=True, exclusive=True, exit_on_error=False, group="validate", name="validate")
    def run_validation(self, heads: str | None) -> dict[str, Any]:
        # lazy: the app paints before the pipeline and its models load
        from headedit import pipeline

        if heads is not None:
            record_choice(self.run_dir, heads, self.reporter)
        return pipeline.validate(self.run_dir, reporter=self.reporter, cancel=self.cancel_event)

    def worker_done(self, name: str, result: Any) -> None:
        if name == "validate":
            self.set_running(False)
            self.show(result)

    def worker_failed(self, name: str, error: BaseException | None) -> None:
        self.set_running(False)
        self.status("validation stopped" + (" (cancelled)" if error is None or self.cancel_event.is_set() else ""))
        if error is not None and not self.cancel_event.is_set():
            super().worker_failed(name, error)

    def show(self, validation: dict[str, Any]) -> None:
        self.validation = validation
        passed = validation.get("passed") is True
        follow = "p continues to publishing" if passed else \
            f"did not pass: nothing to publish (`headedit export {self.run_dir} --force` exports it anyway)"
        self.status(f"heads {validation.get('heads') or '(none)'} · {validation.get('task')} · "
                    f"{validation.get('split', 'heldout')} split · {follow}")
        self.query_one("#results", Static).update(results_table(validation))
        verdict = self.query_one("#verdict", Static)
        verdict.update(("✔ " if validation.get("passed") else "✘ ") + str(validation.get("verdict", "")))
        verdict.set_class(bool(validation.get("passed")), "passed")
        verdict.set_class(not validation.get("passed"), "failed")
        self.refresh_bindings()

    @on(PipelineEvent)
    def pipeline_event(self, message: PipelineEvent) -> None:
        event = message.event
        if isinstance(event, Log):
            self.status(event.message)
        else:
            self.query_one(StageProgressPanel).handle(event)

    def action_publish(self) -> None:
        if self.validation is None:
            self.notify("validation has not finished yet", timeout=2)
            return
        if self.validation.get("passed") is not True:
            self.notify("validation did not pass: `headedit export RUN --force` exports it anyway", timeout=4)
            return
        self.app.open_publish(self.run_dir)  # type: ignore[attr-defined]

    def action_cancel(self) -> None:
        if self.running:
            self.cancel_event.set()
            self.status("cancelling…")

    def action_back(self) -> None:
        if self.running:
            self.notify("validation is running (c cancels)", timeout=2)
            return
        self.app.pop_screen()
