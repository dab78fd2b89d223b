"""The whole flow from the keyboard, on the bundled demo recipe with the real pipeline:
setup -> discovery -> candidates -> bake/validate -> publish to the local Hub server.

Asserts on what the screens received (events, table rows, validation) and on the files produced
(run folder, export, the pushed commit on the server).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from testkit.recipes import recipe_toml

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
SHOTS = os.environ.get("HEADEDIT_TUI_SHOTS")  # a folder: save an SVG of each step there (for humans)


def shot(app, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        (Path(SHOTS) / f"{name}.svg").write_text(app.export_screenshot())


def demo_available() -> bool:
    try:
        from headedit.model.loading import resolve_model
        from headedit.tasks import get_task

        resolve_model("headedit:demo")
        get_task("copy-second")
        return True
    except Exception:
        return False


from .conftest import screen_text, wait_workers


async def test_full_flow_from_the_keyboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           hub_inprocess, hub_user) -> None:
    if not demo_available():
        pytest.skip("the bundled demo model/tasks are not in this checkout yet")
    from headedit.tui.app import HeadeditApp
    from headedit.tui.screens.bake_validate import BakeValidateScreen, record_choice
    from headedit.tui.screens.candidates import CandidatesScreen
    from headedit.tui.screens.discovery import DiscoveryScreen
    from headedit.tui.screens.publish import PublishScreen
    from headedit.tui.screens.setup import SetupScreen
    from headedit.tui.widgets.candidates import HAND_MARK, CandidateTable
    from headedit.tui.widgets.heatmap import HeadHeatmap
    from headedit.tui.widgets.progress import StageProgressPanel

    monkeypatch.chdir(tmp_path)  # runs/ and exports/ land here
    monkeypatch.setenv("HF_TOKEN", hub_user.token)
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[ROOT / "recipes"])
    async with app.run_test(size=(80, 24)) as pilot:
        # ---- setup: the demo recipe is first in the list; enter fills the form ----
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        await pilot.press("enter")
        await pilot.pause(0.6)
        await wait_workers(pilot)
        assert setup.layout_info is not None, setup.model_error
        n_layers, n_heads = setup.layout_info["num_layers"], setup.layout_info["num_heads"]
        # smaller splits keep the test quick; typed like a user would
        for field, value in (("discovery", "200"), ("heldout", "300")):
            setup.query_one(f"#{field}").focus()
            await pilot.press("end", *["backspace"] * 6, *value)
        await pilot.pause()
        assert setup.query_one("#discovery").value == "200"
        shot(app, "setup")
        await pilot.press("ctrl+r")
        await pilot.pause()

        # ---- discovery: the heatmap fills in from HeadScored events ----
        discovery = app.screen
        assert isinstance(discovery, DiscoveryScreen)
        await wait_workers(pilot)
        assert app.errors == [], app.errors
        assert discovery.state == "done"
        await pilot.pause()
        footer = screen_text(app).splitlines()[-1]  # the keys follow the state: nothing left to cancel or resume
        assert "Candidates" in footer and "Cancel" not in footer and "Resume" not in footer, footer
        heatmap = discovery.query_one(HeadHeatmap)
        assert heatmap.scored == n_layers * n_heads
        run_dir = discovery.run_dir
        for name in ("recipe.toml", "run.json", "journal.sqlite", "screen.json", "search.json", "selection.json"):
            assert (run_dir / name).is_file(), name
        screen_table = json.loads((run_dir / "screen.json").read_text())
        for (layer, head), value in heatmap.scores.items():  # what was shown is what was stored
            assert value == pytest.approx(screen_table["delta"][layer][head])
        selection = json.loads((run_dir / "selection.json").read_text())
        assert heatmap.selection_text == selection["heads"] != ""
        stages = discovery.query_one(StageProgressPanel).stages
        assert stages and all(s.finished for s in stages.values())

        shot(app, "discovery")
        # ---- candidates: the trace, a hand-made set evaluated on demand, back to the search's choice ----
        await pilot.press("enter")
        await pilot.pause()
        candidates = app.screen
        assert isinstance(candidates, CandidatesScreen)
        table = candidates.query_one(CandidateTable)
        trace = json.loads((run_dir / "search.json").read_text())["trace"]
        assert table.row_count == len({t["heads"] for t in trace})
        grid = candidates.query_one(HeadHeatmap)
        grid.focus()
        grid.cursor = (n_layers - 1, n_heads - 1)
        await pilot.press("space")  # toggle one more head into the set
        hand = grid.selection_text
        assert hand != selection["heads"] and candidates.current == hand
        await pilot.press("e")
        await wait_workers(pilot)
        assert app.errors == [], app.errors
        row = table.rows_data[hand]
        assert row["note"] == HAND_MARK and 0.0 <= row["acc"] <= 1.0 and row["n"] == selection["n"]
        await pilot.press("a")
        assert candidates.current == selection["heads"]

        shot(app, "candidates")
        # ---- bake & validate ----
        await pilot.press("b")
        await pilot.pause()
        bake = app.screen
        assert isinstance(bake, BakeValidateScreen)
        await wait_workers(pilot)
        assert app.errors == [], app.errors
        validation = json.loads((run_dir / "validation.json").read_text())
        assert bake.validation == validation
        assert validation["heads"] == selection["heads"]
        assert validation["passed"] and validation["gain_points"] >= 50 and validation["ci95_points"][0] > 0
        assert validation["verdict"] in str(bake.query_one("#verdict").render())

        shot(app, "bake_validate")
        # ---- publish: export, card preview, push to the local Hub server ----
        await pilot.press("p")
        await pilot.pause()
        publish = app.screen
        assert isinstance(publish, PublishScreen)
        await wait_workers(pilot)
        assert app.errors == [], app.errors
        export = publish.export_dir
        assert export is not None and (export / "headedit.json").is_file() and (export / "README.md").is_file()
        manifest = json.loads((export / "headedit.json").read_text())
        assert manifest["heads"] == selection["heads"]
        assert "copy-second" in publish.query_one("#card").source
        repo = f"{hub_user.name}/demo-headedit"
        publish.query_one("#repo").focus()
        await pilot.press(*repo)
        await pilot.pause(0.6)
        await wait_workers(pilot)
        assert repo in publish.query_one("#card").source  # the live preview names the repo
        shot(app, "publish")
        await pilot.press("ctrl+p")
        await pilot.pause()
        await wait_workers(pilot)
        assert app.errors == [], app.errors
        assert publish.url and publish.url.startswith(f"{hub_inprocess.url}/{repo}/commit/")
        assert app.last_url == publish.url
        pushed = json.loads(hub_inprocess.file_bytes(repo, "headedit.json", "main"))
        assert pushed["heads"] == selection["heads"]
        assert repo in hub_inprocess.file_bytes(repo, "README.md", "main").decode()
        shot(app, "pushed")

    # a hand-made choice is recorded without losing the search's own
    other = next(t["heads"] for t in trace if t["heads"] and t["heads"] != selection["heads"]) if len(trace) > 1 else hand
    record_choice(run_dir, other, lambda event: None)
    chosen = json.loads((run_dir / "selection.json").read_text())
    assert chosen["heads"] == other and chosen["chosen_by"] == "hand"
    assert chosen["search_heads"] == selection["heads"]


async def test_push_error_opens_modal_and_keeps_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      hub_inprocess, hub_user, hub_export) -> None:
    """A refused token (read-only) ends in the error modal; the export is untouched."""
    from headedit.tui.app import HeadeditApp
    from headedit.tui.screens.error import ErrorModal
    from headedit.tui.screens.publish import PublishScreen

    _, run, export = hub_export
    before = {p.name: p.read_bytes() for p in export.iterdir() if p.is_file()}
    monkeypatch.setenv("HF_TOKEN", hub_user.read_token)
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=(80, 24)) as pilot:
        screen = PublishScreen(run, export_dir=export, repo_id=f"{hub_user.name}/refused", start=False)
        await app.push_screen(screen)
        await wait_workers(pilot)
        card = screen.query_one("#card")
        for _ in range(100):  # the preview's blocks are mounted after the worker ends
            if card.size.height:
                break
            await pilot.pause(0.05)
        assert card.size.height > 0 and card.source.splitlines()[0].lstrip("# ") in screen_text(app)
        await pilot.press("ctrl+p")
        await wait_workers(pilot)
        assert isinstance(app.screen, ErrorModal)
        assert len(app.errors) == 1 and "read-only" in str(app.errors[0])
        assert "push failed" in str(screen.query_one("#publish-status").render())
        await pilot.press("enter")
        assert app.screen is screen
    from headedit.export.bake import verify_export

    verify_export(export)  # the export still matches its manifest
    for name in ("model.safetensors", "config.json"):
        assert (export / name).read_bytes() == before[name]


async def test_cancel_leaves_a_resumable_run(tmp_path: Path, tiny_dir: Path) -> None:
    """Cancel mid-screen: the worker stops at its next checkpoint, the journal keeps what finished,
    and `r` resumes the same run folder to the end without redoing finished evaluations."""
    from headedit.tui.app import HeadeditApp
    from headedit.tui.screens.discovery import DiscoveryScreen

    from headedit.events import SetEvaluated, StageProgress
    from headedit.recipe import parse_recipe

    recipe = parse_recipe(recipe_toml("cancel", model={"id": tiny_dir, "device": "cpu"},
                                      task={"name": "arithmetic", "discovery": 64, "heldout": 32},
                                      discovery={"candidates": 3, "max_heads": 2}))

    class CancelOnFirstProgress(DiscoveryScreen):
        """A user who presses Cancel the instant the first progress tick arrives (set in the worker thread,
        so the timing is exact)."""

        cancelled_once = False
        cached: list[str] = []

        @property
        def reporter(self):
            post = super().reporter

            def report(event):
                post(event)
                if isinstance(event, SetEvaluated) and event.cached:
                    self.cached.append(event.heads)
                if isinstance(event, StageProgress) and not self.cancelled_once:
                    self.cancelled_once = True
                    self.cancel_event.set()
            return report

    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    run_dir = tmp_path / "runs" / "cancel-run"
    async with app.run_test(size=(80, 24)) as pilot:
        screen = CancelOnFirstProgress(run_dir, recipe=recipe, layout=(2, 4))
        await app.push_screen(screen)
        await wait_workers(pilot)
        assert screen.state == "cancelled" and app.errors == []
        assert "r resumes" in str(screen.query_one("#run-status").render())
        await pilot.pause()
        footer = screen_text(app).splitlines()[-1]
        assert "Resume" in footer and "Cancel" not in footer and "Candidates" not in footer, footer
        assert (run_dir / "journal.sqlite").is_file() and not (run_dir / "selection.json").exists()
        from headedit.journal import Journal

        with Journal(run_dir / "journal.sqlite") as journal:
            done_before = len(journal.entries())
        assert done_before >= 1
        await pilot.press("r")
        await wait_workers(pilot)
        assert screen.state == "done", app.errors
        assert (run_dir / "selection.json").is_file() and (run_dir / "search.json").is_file()
        with Journal(run_dir / "journal.sqlite") as journal:
            assert len(journal.entries()) >= done_before
