"""Publish: the export (baked checkpoint + card), a live preview of the model card as the repo id is
typed, a private toggle, and a push whose commit URL is shown; failures open the error modal and the
local export is left as it was."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headedit.tui.messages import PipelineEvent
from headedit.tui.screens.base import StepScreen
from headedit.tui.widgets.progress import StageProgressPanel
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.timer import Timer
from textual.widgets import Button, Footer, Header, Input, Label, Markdown, Static, Switch

from headedit.errors import HeadeditError

PREVIEW_DELAY = 0.4


class PublishScreen(StepScreen):
    BINDINGS = [
        Binding("ctrl+p", "push", "Push", priority=True),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, run_dir: Path, export_dir: Path | None = None, repo_id: str | None = None,
                 private: bool = True, start: bool = True) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self.repo_id = repo_id or ""
        self.private = private
        self.start = start
        self.url: str | None = None
        self.busy = False
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="publish"):
            with Horizontal(classes="field"):
                yield Label("Repo id", classes="field-label")
                yield Input(self.repo_id, id="repo", compact=True, placeholder="your-name/model-headedit")
                yield Label("Private", classes="switch-label")
                yield Switch(self.private, id="private", animate=False)
            yield Static("", id="repo-error", classes="field-error", markup=False)
            yield StageProgressPanel(id="stages")
            yield Static("", id="publish-status", markup=False)
            yield Button("Push (ctrl+p)", id="push", variant="primary")
            yield Label("Model card preview", classes="section")
            with VerticalScroll(id="card-box"):
                yield Markdown("", id="card")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"publish · {self.run_dir.name}"
        if self.export_dir is not None and (self.export_dir / "headedit.json").is_file():
            self.status(f"export {self.export_dir.name} ready")
            self.schedule_preview(now=True)
        elif self.start:
            self.busy = True
            self.status("baking the export (checkpoint, card, record)…")
            self.make_export()

    def status(self, text: str) -> None:
        self.query_one("#publish-status", Static).update(text)
        self.refresh_bindings()  # push is offered only once the export is ready and nothing is running

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "push":
            return None if self.busy or self.export_dir is None else True  # None: shown, greyed out
        return True

    # ---- export and preview -----------------------------------------------------------------
    @work(thread=True, exclusive=True, exit_on_error=False, group="export", name="export")
    def make_export(self) -> Path:
        # lazy: the app paints before the pipeline and its models load
        from headedit.pipeline.export import default_export_dir, export_run
        from headedit.runs import Run

        run = Run.open(self.run_dir)
        target = self.export_dir or default_export_dir(run.recipe())
        manifest = Path(target) / "headedit.json"
        if manifest.is_file():  # an earlier export of this run: reuse it when it holds the same heads
            # lazy: the app paints before the pipeline and its models load
            from headedit.export.bake import read_manifest

            if read_manifest(Path(target)).get("heads") == run.selection().get("heads"):
                return Path(target)
        return export_run(self.run_dir, out=target, reporter=self.reporter)

    @work(thread=True, exclusive=True, exit_on_error=False, group="preview", name="preview")
    def render_preview(self, repo_id: str | None) -> str:
        # lazy: the app paints before the pipeline and its models load
        from headedit.export.card import render_card

        assert self.export_dir is not None
        card = render_card(self.export_dir, self.run_dir, repo_id=repo_id or None)
        # Markdown would mangle the YAML front matter: show it as a fenced block after the body
        return f"{card.text.strip()}\n\n## Card metadata\n\n```yaml\n{card.data.to_yaml().strip()}\n```\n"

    def schedule_preview(self, now: bool = False) -> None:
        if self.export_dir is None:
            return
        if self._timer is not None:
            self._timer.stop()
        repo = self.query_one("#repo", Input).value.strip()
        if now:
            self.render_preview(repo)
        else:
            self._timer = self.set_timer(PREVIEW_DELAY, lambda: self.render_preview(repo))

    @on(Input.Changed, "#repo")
    def repo_changed(self, event: Input.Changed) -> None:
        self.check_repo()
        self.schedule_preview()

    def check_repo(self) -> str | None:
        # lazy: the app paints before the pipeline and its models load
        from headedit.export.hub import check_repo_id

        repo = self.query_one("#repo", Input).value.strip()
        error = self.query_one("#repo-error", Static)
        try:
            check_repo_id(repo)
        except HeadeditError as err:
            error.update(str(err))
            error.set_class(True, "shown")
            self.query_one("#repo", Input).set_class(True, "invalid")
            return None
        error.update("")
        error.set_class(False, "shown")
        self.query_one("#repo", Input).set_class(False, "invalid")
        return repo

    # ---- push -------------------------------------------------------------------------------
    @on(Button.Pressed, "#push")
    def push_pressed(self) -> None:
        self.action_push()

    def action_push(self) -> None:
        if self.busy or self.export_dir is None:
            self.notify("the export is not ready yet", timeout=2)
            return
        repo = self.check_repo()
        if repo is None:
            return
        self.busy = True
        self.query_one(StageProgressPanel).clear()
        self.status(f"pushing to {repo}…")
        self.push(repo, self.query_one("#private", Switch).value)

    @work(thread=True, exclusive=True, exit_on_error=False, group="push", name="push")
    def push(self, repo: str, private: bool) -> str:
        # lazy: the app paints before the pipeline and its models load
        from headedit.export.card import write_card
        from headedit.export.hub import push_export

        assert self.export_dir is not None
        write_card(self.export_dir, self.run_dir, repo_id=repo)  # the pushed card names the repo
        return push_export(self.export_dir, repo, private=private, reporter=self.reporter)

    def worker_done(self, name: str, result: Any) -> None:
        if name == "export":
            self.busy = False
            self.export_dir = Path(result)
            self.status(f"export {self.export_dir.name} ready · ctrl+p pushes")
            self.schedule_preview(now=True)
        elif name == "preview":
            self.call_later(self.show_card, result)
        elif name == "push":
            self.busy = False
            self.url = str(result)
            self.status(f"pushed: {self.url}")
            self.app.published(self.url)  # type: ignore[attr-defined]

    async def show_card(self, text: str) -> None:
        """Replace the preview; the box is re-laid out once the new blocks are mounted (else it stays 0 high)."""
        card = self.query_one("#card", Markdown)
        await card.update(text)
        card.refresh(layout=True)

    def worker_failed(self, name: str, error: BaseException | None) -> None:
        self.busy = False
        if name == "push":
            self.status("push failed; the local export is kept")
        elif name == "export":
            self.status("export failed")
        super().worker_failed(name, error)

    @on(PipelineEvent)
    def pipeline_event(self, message: PipelineEvent) -> None:
        self.query_one(StageProgressPanel).handle(message.event)

    def action_back(self) -> None:
        if self.busy:
            self.notify("working… wait for it to finish", timeout=2)
            return
        self.app.pop_screen()

