"""Every screen at 80x24 shows its texts whole: task names and numbers of the validation table, journal lines,
status lines, candidate rows with their n, recent run names, and every key the footer offers. Read from the
rendered screen, not from the widgets' data."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from headedit.tui.app import HeadeditApp
from headedit.tui.messages import PipelineEvent
from headedit.tui.screens.bake_validate import BakeValidateScreen
from headedit.tui.screens.candidates import CandidatesScreen
from headedit.tui.screens.discovery import STATUS, DiscoveryScreen
from headedit.tui.screens.setup import SetupScreen
from headedit.tui.widgets.candidates import LEGEND

from headedit.events import Log, SetEvaluated, StageFinished, StageStarted
from headedit.runs import read_json

from .conftest import screen_text
from .runfolder import write_run

pytestmark = pytest.mark.anyio
SIZE = (80, 24)


def region_text(app, widget) -> str:
    """The text inside `widget`'s content region on the rendered screen."""
    region = widget.content_region
    lines = screen_text(app).splitlines()[region.y:region.y + region.height]
    return "\n".join(line[region.x:region.x + region.width] for line in lines)


def words(text: str) -> str:
    return " ".join(text.split())


def shows(app, widget, text: str) -> bool:
    """`text` is on screen inside `widget`, whole (a wrap at a space is fine; a cut or an ellipsis is not)."""
    return words(text) in words(region_text(app, widget))


def footer_shows_every_key(app) -> None:
    footer = screen_text(app).splitlines()[-1]
    for key, active in app.screen.active_bindings.items():
        if active.binding.show and active.binding.description:
            assert active.binding.description in footer, (key, active.binding.description, footer)


async def test_validation_table_and_status_fit_80_columns(tmp_path: Path) -> None:
    run = write_run(tmp_path / "runs" / "snap-20250101-000000")
    validation = read_json(run / "validation.json")
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(BakeValidateScreen(run, start=False))
        await pilot.pause()
        lines = screen_text(app).splitlines()
        target = next(line for line in lines if line.strip().startswith("copy-second"))
        side = next(line for line in lines if "side: copy-first" in line)
        for cell in ("2.5", "98.5", "+96.0", "98%", "400", "[+94.1,+97.6]", "<1e-300"):
            assert cell in target, (cell, target)
        for cell in ("97.0", "2.0", "-95.0", "400", "[-97.0,-92.8]", "<1e-300"):
            assert cell in side, (cell, side)
        screen = app.screen
        assert shows(app, screen.query_one("#verdict"), "✔ " + validation["verdict"])
        assert shows(app, screen.query_one("#bake-status"), "heads 0.1,1.2 · copy-second · heldout split · "
                                                             "p continues to publishing")
        footer_shows_every_key(app)


async def test_discovery_journal_and_status_lines_fit_80_columns(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "smollm3-arithmetic-20250101-000000"
    run.mkdir(parents=True)
    long_log = ("early stop dropped 0.3 after 63 examples: its discordant pairs give p = 0.004 < 0.01, "
                "so it ranks after every completed head")
    summary = "selected 0.0,1.1: 99.60% vs intact 4.00% (32 sets, 14 pruned)"
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=SIZE) as pilot:
        screen = DiscoveryScreen(run, layout=(2, 4), start=False)
        await app.push_screen(screen)
        for event in (StageStarted("search", 3), SetEvaluated("search", "0.0,0.2,1.1", 0.9375, 2000, cached=True),
                      Log(long_log), StageFinished("search", summary)):
            screen.post_message(PipelineEvent(event))
        await pilot.pause()
        screen.set_state("done", " · selected 0.0,1.1")
        await pilot.pause()
        journal = screen.query_one("#journal")
        assert shows(app, journal, "search: 0.0,0.2,1.1 acc 0.938 n 2000 (journal)")
        assert shows(app, journal, long_log)
        assert shows(app, journal, f"search: {summary}")
        assert shows(app, screen.query_one("#run-status"), STATUS["done"] + " · selected 0.0,1.1")
        assert "smollm3-arithmetic-20250101-000000" in screen_text(app).splitlines()[0]  # the header names the run
        footer_shows_every_key(app)


async def test_candidate_rows_with_n_fit_80_columns(tmp_path: Path) -> None:
    run = write_run(tmp_path / "runs" / "snap-20250101-000000", validated=False)
    trace = read_json(run / "search.json")["trace"]
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(CandidatesScreen(run))
        await pilot.pause()
        lines = screen_text(app).splitlines()
        for entry in trace:
            row = next(line for line in lines if line.split() and line.split()[0] == entry["heads"])
            cells = [entry["heads"], str(entry["size"]), f"{entry['acc']:.3f}", f"{entry['gain']:+.1f}",
                     str(entry.get("n", 200))]
            assert row.split()[:5] == cells, (row, cells)
        chosen = next(line for line in lines if line.split() and line.split()[0] == "0.1,1.2")
        assert chosen.split()[5] == "★"
        screen = app.screen
        assert shows(app, screen.query_one("#trace-legend"), LEGEND)
        assert shows(app, screen.query_one("#set-summary"), "0.1,1.2 (search's choice): acc 0.970, +94.0 pts, n 200")
        footer_shows_every_key(app)
        screen.query_one("#heatmap").focus()
        await pilot.pause()
        footer_shows_every_key(app)
        screen.query_one("#set").focus()  # typing in the head-set box: the footer still offers the screen's keys
        await pilot.pause()
        assert {"Evaluate", "Bake"} <= {a.binding.description for a in app.screen.active_bindings.values()}
        footer_shows_every_key(app)


async def test_setup_shows_long_run_names_and_the_layout_whole(tmp_path: Path, demo_run: Path) -> None:
    root = tmp_path / "runs"
    name = "smollm3-arithmetic-20250101-000000"
    shutil.copytree(demo_run, root / name, ignore=shutil.ignore_patterns("lock"))
    app = HeadeditApp(Path(__file__).resolve().parents[2] / "recipes" / "demo.toml", runs_root=root)
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        runs = region_text(app, setup.query_one("#runs"))
        assert name in "".join(runs.split()) and "validated" in runs  # wrapped inside the list, never cut
        assert shows(app, setup.query_one("#layout"), "LlamaForCausalLM · 2 layers × 4 heads (4 KV) · head_dim 8")
        footer_shows_every_key(app)


async def test_a_failed_validation_greys_out_publishing(tmp_path: Path) -> None:
    """A set whose gain did not hold is not exported unforced: `p` is shown greyed, pressing it stays here, and the
    status line says how to export it anyway."""
    import json

    run = write_run(tmp_path / "runs" / "snap-20250101-000000")
    record = read_json(run / "validation.json")
    record.update(passed=False, verdict="gain did not hold on held-out: +0.5 points, 95% CI [-0.4, 1.4]")
    (run / "validation.json").write_text(json.dumps(record))
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=(120, 24)) as pilot:
        screen = BakeValidateScreen(run, start=False)
        await app.push_screen(screen)
        await pilot.pause()
        assert screen.check_action("publish", ()) is None  # shown, greyed out
        assert "did not pass: nothing to publish" in words(region_text(app, screen.query_one("#bake-status")))
        assert "--force" in words(region_text(app, screen.query_one("#bake-status")))
        await pilot.press("p")
        await pilot.pause()
        assert app.screen is screen
