"""Snapshots of every screen at 100x30 (pytest-textual-snapshot; update with --snapshot-update).

Content is deterministic: run folders have fixed names, the progress clock is frozen, animations are off
and the input cursor does not blink.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from headedit.tui.app import HeadeditApp
from headedit.tui.messages import PipelineEvent
from headedit.tui.screens.bake_validate import BakeValidateScreen
from headedit.tui.screens.candidates import CandidatesScreen
from headedit.tui.screens.discovery import DiscoveryScreen
from headedit.tui.screens.publish import PublishScreen
from headedit.tui.widgets.progress import StageProgressPanel

from headedit.errors import HubError
from headedit.events import HeadScored, Log, SetEvaluated, StageFinished, StageProgress, StageStarted

from .runfolder import DELTA, RECIPE, write_run

SIZE = tuple(int(x) for x in os.environ.get("TUI_SNAP_SIZE", "100x30").split("x"))


@pytest.fixture(autouse=True)
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
    monkeypatch.setattr(StageProgressPanel, "clock", staticmethod(lambda: 100.0))


class SnapApp(HeadeditApp):
    """The real app, with a fixed recipe folder and no blinking cursor."""

    def __init__(self, root: Path, **kwargs) -> None:
        recipes = root / "recipes"
        recipes.mkdir(exist_ok=True)
        # a stable form: a registered task and a model path that does not exist (its inline error)
        text = RECIPE.replace('"headedit:demo"', '"./no-such-model"').replace('"copy-second"', '"arithmetic"')
        (recipes / "snap.toml").write_text(text.replace('side_tasks = ["copy-first"]', "side_tasks = []"))
        super().__init__(runs_root=root / "runs", recipe_dirs=[recipes], **kwargs)
        self.animation_level = "none"

    def on_mount(self) -> None:
        super().on_mount()
        for widget in self.query("Input"):
            widget.cursor_blink = False


def test_setup_screen(snap_compare, tmp_path: Path) -> None:
    async def run_before(pilot) -> None:
        await pilot.press("enter")  # fill the form from the recipe
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        for widget in pilot.app.screen.query("Input"):
            widget.cursor_blink = False

    assert snap_compare(SnapApp(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_discovery_screen(snap_compare, tmp_path: Path) -> None:
    run_dir = tmp_path / "snap-run"
    run_dir.mkdir()

    async def run_before(pilot) -> None:
        screen = DiscoveryScreen(run_dir, layout=(2, 4), start=False)
        await pilot.app.push_screen(screen)
        events = [StageStarted("load"), StageFinished("load", "model loaded"), StageStarted("screen:single", 8)]
        for i, (layer, head) in enumerate([(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)]):
            events += [HeadScored("screen:single", layer, head, DELTA[layer][head], {"acc": 0.5, "n": 200}),
                       StageProgress("screen:single", i + 1, 8)]
        events += [SetEvaluated("screen:single", "0.1", 0.45, 200), Log("early stop dropped 0.3 after 32 examples")]
        for event in events:
            screen.post_message(PipelineEvent(event))
        await pilot.pause()
        screen.set_state("running")
        screen.query_one("HeadHeatmap").focus()
        await pilot.press("right")

    assert snap_compare(SnapApp(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_candidates_screen(snap_compare, tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "snap-run", validated=False)

    async def run_before(pilot) -> None:
        await pilot.app.push_screen(CandidatesScreen(run_dir))
        await pilot.pause()
        for widget in pilot.app.screen.query("Input"):
            widget.cursor_blink = False

    assert snap_compare(SnapApp(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_bake_validate_screen(snap_compare, tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "snap-run")

    async def run_before(pilot) -> None:
        await pilot.app.push_screen(BakeValidateScreen(run_dir, start=False))
        await pilot.pause()

    assert snap_compare(SnapApp(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_publish_screen(snap_compare, tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "snap-run")

    async def run_before(pilot) -> None:
        screen = PublishScreen(run_dir, repo_id="alice/demo-headedit", start=False)
        await pilot.app.push_screen(screen)
        screen.status("export snap ready · ctrl+p pushes")
        await screen.query_one("#card").update("# demo, 2 head(s) ablated for copy-second\n\n| task | intact | edited |\n|---|---|---|\n| copy-second | 2.5 | 98.5 |\n")
        for widget in screen.query("Input"):
            widget.cursor_blink = False
        await pilot.pause()

    assert snap_compare(SnapApp(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare, tmp_path: Path) -> None:
    assert snap_compare(SnapApp(tmp_path), terminal_size=SIZE, press=["f1"])


def test_error_modal(snap_compare, tmp_path: Path) -> None:
    async def run_before(pilot) -> None:
        pilot.app.show_error(HubError("the Hub refused the token (401)", "set HF_TOKEN to a token with write access"))
        await pilot.pause()

    assert snap_compare(SnapApp(tmp_path), terminal_size=SIZE, run_before=run_before)
