"""`headedit tui`: the Textual app. Thin: it holds the session's state and moves between screens;
every piece of work is a library call made by a screen's thread worker."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headedit.tui.screens.bake_validate import BakeValidateScreen
from headedit.tui.screens.candidates import CandidatesScreen
from headedit.tui.screens.discovery import DiscoveryScreen
from headedit.tui.screens.error import ErrorModal
from headedit.tui.screens.help import HelpScreen
from headedit.tui.screens.publish import PublishScreen
from headedit.tui.screens.setup import SetupScreen
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from headedit.errors import HeadeditError, RunError


def unreadable_run(run_dir: Path, err: BaseException) -> HeadeditError:
    """A run file that parses but does not hold what its stage writes, as a user-facing error."""
    if isinstance(err, HeadeditError):
        return err
    return RunError(f"cannot read the results of run {Path(run_dir).name}: {type(err).__name__}: {err}",
                    "resume the run to redo the unfinished stage, or start a new run")


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
        """A recipe file fills the setup form (once it is composed); a run folder opens at the step it reached."""
        recipe = self.target if self.target is not None and not self.target.is_dir() else None
        self.setup_screen = SetupScreen(self.runs_root, self.recipe_dirs, recipe=recipe)
        self.push_screen(self.setup_screen)
        if self.target is not None and self.target.is_dir():
            self.open_run(self.target)

    # ---- errors -----------------------------------------------------------------------------
    def show_error(self, error: BaseException) -> None:
        """The one place a failed worker ends up: a modal with the message and its hint."""
        self.errors.append(error)
        self.push_screen(ErrorModal(error))

    # ---- navigation (called by screens) ------------------------------------------------------
    def start_discovery(self, recipe: Any, layout_info: dict[str, Any], compare: str | None = None) -> None:
        # lazy: the app paints before the pipeline and its models load
        from headedit.runs import default_run_dir

        self.compare = compare
        run_dir = default_run_dir(recipe.name, self.runs_root)
        layout = (int(layout_info["num_layers"]), int(layout_info["num_heads"]))
        self.push_screen(DiscoveryScreen(run_dir, recipe=recipe, layout=layout))

    def open_run(self, run_dir: Path) -> None:
        """Open a run at the step it reached, with every earlier step beneath it, so Esc walks back in
        pipeline order (validation -> candidates -> discovery -> setup) and a finished run's heatmap and
        candidates stay reachable."""
        run_dir = Path(run_dir)

        def stages() -> list[Screen[Any]]:
            # lazy: the app paints before the pipeline and its models load
            from headedit.runs import Run

            Run.open(run_dir)
            screens: list[Screen[Any]] = [DiscoveryScreen(run_dir, resume=True, start=False)]
            if (run_dir / "selection.json").is_file():
                screens.append(CandidatesScreen(run_dir))
            if (run_dir / "validation.json").is_file():
                screens.append(BakeValidateScreen(run_dir, start=False))
            return screens

        self.open_screens(run_dir, stages)

    def open_screens(self, run_dir: Path, build: Callable[[], list[Screen[Any]]]) -> None:
        """Push the screens `build` makes. Screens read their run files when built, so a missing or corrupt
        file ends here as the error modal, before anything is pushed, never as a crash."""
        try:
            screens = build()
        except (HeadeditError, OSError, ValueError, KeyError, TypeError) as err:
            self.show_error(unreadable_run(run_dir, err))
            return
        for screen in screens:
            self.push_screen(screen)

    def run_finished(self, run_dir: Path) -> None:
        self.setup_screen.refresh_runs()

    def open_candidates(self, run_dir: Path) -> None:
        self.open_screens(run_dir, lambda: [CandidatesScreen(run_dir, compare=self.compare)])

    def open_bake(self, run_dir: Path, heads: str) -> None:
        self.open_screens(run_dir, lambda: [BakeValidateScreen(run_dir, heads=heads)])

    def open_publish(self, run_dir: Path) -> None:
        def publish() -> list[Screen[Any]]:
            # lazy: the app paints before the pipeline and its models load
            from headedit.runs import Run

            recipe = Run.open(run_dir).recipe()
            return [PublishScreen(run_dir, repo_id=recipe.export.repo_id, private=recipe.export.private)]

        self.open_screens(run_dir, publish)

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

