"""Starting the TUI the ways users do: `headedit tui RECIPE`, `headedit tui RUN` (a finished demo run, walked
back through its stages with Esc), `headedit tui` (Ctrl+O, Enter opens the newest run); and the exit code of
the real command when the app dies."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from headedit.tui.app import HeadeditApp
from headedit.tui.screens.bake_validate import BakeValidateScreen
from headedit.tui.screens.candidates import CandidatesScreen
from headedit.tui.screens.discovery import DiscoveryScreen
from headedit.tui.screens.setup import SetupScreen
from headedit.tui.widgets.candidates import CandidateTable
from headedit.tui.widgets.heatmap import HeadHeatmap

from headedit.runs import read_json

from .conftest import screen_text, wait_workers

ROOT = Path(__file__).resolve().parents[2]
DEMO_RECIPE = ROOT / "recipes" / "demo.toml"
HEADLESS = "textual.drivers.headless_driver:HeadlessDriver"


def copy_run(demo_run: Path, root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(demo_run, target, ignore=shutil.ignore_patterns("lock"))
    return target


def footer(app) -> str:
    return screen_text(app).splitlines()[-1]


@pytest.mark.anyio
async def test_starts_from_a_recipe_file(tmp_path: Path) -> None:
    """`headedit tui recipes/demo.toml`: the form holds the recipe and the model's layout is read."""
    app = HeadeditApp(DEMO_RECIPE, runs_root=tmp_path / "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_workers(pilot)
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        values = setup.values()
        assert (values["model"], values["task"], values["discovery"], values["heldout"]) == (
            "headedit:demo", "copy-second", "1000", "2000")
        assert setup.layout_info is not None and setup.layout_info["num_layers"] == 2, setup.model_error
        assert "2 layers × 4 heads" in screen_text(app)
        assert app.errors == []


@pytest.mark.anyio
async def test_starts_from_a_finished_run_and_esc_walks_back_through_its_stages(demo_run: Path,
                                                                              tmp_path: Path) -> None:
    """`headedit tui RUN` opens validation; Esc goes to the candidates, the discovery heatmap, then setup;
    the footer offers only what each state allows."""
    run = copy_run(demo_run, tmp_path / "runs", demo_run.name)
    selection = read_json(run / "selection.json")
    trace = read_json(run / "search.json")["trace"]
    app = HeadeditApp(run, runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_workers(pilot)
        bake = app.screen
        assert isinstance(bake, BakeValidateScreen)
        assert bake.validation == read_json(run / "validation.json")
        assert "Publish" in footer(app) and "Cancel" not in footer(app)

        await pilot.press("escape")
        candidates = app.screen
        assert isinstance(candidates, CandidatesScreen)
        table = candidates.query_one(CandidateTable)
        assert table.row_count == len({t["heads"] for t in trace})
        full_n = selection["n"]
        for entry in trace:  # the n column: the examples each row was scored on
            assert table.rows_data[entry["heads"]]["n"] == entry.get("n", full_n)
            assert str(entry.get("n", full_n)) == str(table.get_cell(entry["heads"], "n"))

        await pilot.press("escape")
        discovery = app.screen
        assert isinstance(discovery, DiscoveryScreen) and discovery.state == "done"
        heatmap = discovery.query_one(HeadHeatmap)
        assert heatmap.scored == 8 and heatmap.selection_text == selection["heads"]
        shown = footer(app)
        assert "Candidates" in shown and "Cancel" not in shown and "Resume" not in shown

        await pilot.press("enter")  # the finished run's candidates, again
        assert isinstance(app.screen, CandidatesScreen)
        await pilot.press("escape", "escape")
        assert isinstance(app.screen, SetupScreen)
        assert app.errors == []


@pytest.mark.anyio
async def test_starts_with_no_argument_and_ctrl_o_enter_opens_the_newest_run(demo_run: Path,
                                                                              tmp_path: Path) -> None:
    root = tmp_path / "runs"
    older = copy_run(demo_run, root, "demo-20250101-000000")
    newer = copy_run(demo_run, root, "demo-20250102-000000")
    (newer / "validation.json").unlink()  # stopped after discovery
    os.utime(older / "run.json", (time.time() - 60, time.time() - 60))
    app = HeadeditApp(None, runs_root=root, recipe_dirs=[ROOT / "recipes"])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        assert [p.name for p, _ in setup.runs] == [newer.name, older.name]
        await pilot.press("ctrl+o", "enter")  # no Down needed
        await pilot.pause()
        assert isinstance(app.screen, CandidatesScreen) and app.screen.run_dir == newer
        await pilot.press("escape", "escape")
        assert app.screen is setup
        await pilot.press("f2", "ctrl+o", "down", "ctrl+o")  # from the recipes; Ctrl+O again opens the highlighted
        await pilot.pause()
        assert isinstance(app.screen, BakeValidateScreen) and app.screen.run_dir == older
        assert app.errors == []


def test_cli_exits_nonzero_when_the_app_dies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The real `headedit tui` entry (headless driver): an unexpected error inside the app ends the process
    with a non-zero code and a line saying so, never a silent 0."""
    import textual.constants

    from headedit import cli

    def broken(self, path: Path) -> None:
        raise RuntimeError("simulated bug in the setup screen")

    monkeypatch.setattr(textual.constants, "DRIVER", HEADLESS)
    monkeypatch.setattr(SetupScreen, "load_recipe_file", broken)
    code = cli.main(["tui", str(DEMO_RECIPE), "--runs", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 1
    assert "simulated bug" in err and "headedit: internal error: the terminal UI stopped" in err


@pytest.mark.parametrize("target", ["recipe", "run", "none"])
def test_cli_starts_each_way_and_exits_zero_after_a_clean_quit(target: str, demo_run: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`headedit tui recipes/demo.toml` (it crashed on start, printed a traceback and exited 0), `headedit tui
    RUN` and `headedit tui` through the real entry, headless: they load, quit on ctrl+q, exit 0, print nothing."""
    import textual.constants

    from headedit import cli

    runs = tmp_path / "runs"
    run = copy_run(demo_run, runs, demo_run.name)
    argv = {"recipe": [str(DEMO_RECIPE)], "run": [str(run)], "none": []}[target]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(textual.constants, "DRIVER", HEADLESS)
    monkeypatch.setattr(textual.constants, "PRESS", "wait:1000,ctrl+q")
    assert cli.main(["tui", *argv, "--runs", str(runs)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "NoMatches" not in err and "error" not in err.lower(), err[-2000:]
