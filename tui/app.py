"""`headedit tui`: the Textual app. Thin: it holds the session's state and moves between screens;
every piece of work is a library call made by a screen's thread worker."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import App
from textual.binding import Binding

from headedit.errors import HeadeditError, RunError

from headedit.tui.screens.bake_validate import BakeValidateScreen
from headedit.tui.screens.candidates import CandidatesScreen
from headedit.tui.screens.discovery import DiscoveryScreen
from headedit.tui.screens.error import ErrorModal
from headedit.tui.screens.help import HelpScreen
from headedit.tui.screens.publish import PublishScreen
from headedit.tui.screens.setup import SetupScreen


class HeadeditApp(App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute, so subclasses elsewhere find it
    TITLE = "headedit"
    ENABLE_COMMAND_PALETTE = False  # keeps ctrl+p for Push and the footer short at 80 columns
    BINDINGS = [
        Binding("question_mark,f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, target: str | Path | None = None, runs_root: str | Path = "runs",
                 recipe_dirs: list[Path] | None = None) -> None:
        super().__init__()
        self.target = Path(target) if target is not None else None
        self.runs_root = Path(runs_root)
        self.recipe_dirs = recipe_dirs
        self.compare: str | None = None
        self.errors: list[BaseException] = []  # every error shown, for tests and the log
        self.last_url: str | None = None

    def on_mount(self) -> None:
        self.setup_screen = SetupScreen(self.runs_root, self.recipe_dirs)
        self.push_screen(self.setup_screen)
        if self.target is not None:
            self.open_target(self.target)

    def open_target(self, target: Path) -> None:
        """A recipe file fills the form; a run folder opens at the step it reached."""
        if target.is_dir():
            self.open_run(target)
        else:
            self.setup_screen.load_recipe_file(target)

    # ---- errors -----------------------------------------------------------------------------
    def show_error(self, error: BaseException) -> None:
        """The one place a failed worker ends up: a modal with the message and its hint."""
        self.errors.append(error)
        self.push_screen(ErrorModal(error))

    # ---- navigation (called by screens) ------------------------------------------------------
    def start_discovery(self, recipe: Any, layout_info: dict[str, Any], compare: str | None = None) -> None:
        from headedit.runs import default_run_dir

        self.compare = compare
        run_dir = default_run_dir(recipe.name, self.runs_root)
        layout = (int(layout_info["num_layers"]), int(layout_info["num_heads"]))
        self.push_screen(DiscoveryScreen(run_dir, recipe=recipe, layout=layout))

    def open_run(self, run_dir: Path) -> None:
        run_dir = Path(run_dir)
        try:
            from headedit.runs import Run

            Run.open(run_dir)
        except HeadeditError as err:
            self.show_error(err)
            return
        if (run_dir / "validation.json").is_file():
            self.push_screen(BakeValidateScreen(run_dir, start=False))
        elif (run_dir / "selection.json").is_file():
            self.open_candidates(run_dir)
        else:
            self.push_screen(DiscoveryScreen(run_dir, resume=True, start=False))

    def run_finished(self, run_dir: Path) -> None:
        self.setup_screen.refresh_runs()

    def open_candidates(self, run_dir: Path) -> None:
        try:
            screen = CandidatesScreen(run_dir, compare=self.compare)
        except (OSError, ValueError, HeadeditError) as err:
            self.show_error(err if isinstance(err, HeadeditError) else RunError(
                f"cannot read the results of run {Path(run_dir).name}: {err}", "resume the run to finish it"))
            return
        self.push_screen(screen)

    def open_bake(self, run_dir: Path, heads: str) -> None:
        self.push_screen(BakeValidateScreen(run_dir, heads=heads))

    def open_publish(self, run_dir: Path) -> None:
        repo_id, private = None, True
        try:
            from headedit.pipeline.export import run_recipe

            recipe = run_recipe(run_dir)
            repo_id, private = recipe.export.repo_id, recipe.export.private
        except HeadeditError:
            pass
        self.push_screen(PublishScreen(run_dir, repo_id=repo_id, private=private))

    def published(self, url: str) -> None:
        self.last_url = url
        self.notify(f"pushed: {url}", timeout=8)

    # ---- app actions ------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, (HelpScreen, ErrorModal)):
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        """Stop running work at its next checkpoint (runs stay resumable), then leave."""
        for screen in self.screen_stack:
            event = getattr(screen, "cancel_event", None)
            if event is not None:
                event.set()
        self.exit()


def run_app(target: str | None = None) -> None:
    HeadeditApp(target).run()
