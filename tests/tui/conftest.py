"""Shared fixtures for the TUI tests: async tests run on asyncio through anyio's pytest plugin."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_dir(tiny_model_dir: Path) -> Path:
    """A random-weight tiny Llama saved as safetensors with its tokenizer (the suite's shared one)."""
    return tiny_model_dir


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished (discovered and validated) run of the bundled demo recipe, made by the real pipeline with
    smaller splits; tests copy it before changing anything."""
    from headedit import pipeline
    from headedit.recipe import parse_recipe

    root = Path(__file__).resolve().parents[2]
    text = (root / "recipes" / "demo.toml").read_text()
    text = text.replace("discovery = 1000", "discovery = 300").replace("heldout = 2000", "heldout = 200")
    run_dir = tmp_path_factory.mktemp("demo") / "runs" / "demo-20250101-000000"
    pipeline.discover(parse_recipe(text), run_dir=run_dir)
    pipeline.validate(run_dir)
    return run_dir


async def wait_workers(pilot) -> None:
    """Until every worker has ended (failed ones included: their errors go to the app's modal)."""
    from textual.worker import WorkerState

    await pilot.pause()
    while any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in pilot.app.workers):
        await pilot.pause(0.05)
    await pilot.pause()


def screen_text(app) -> str:
    """What the terminal shows right now, as plain text lines (the app's own compositor, no styles)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), color_system=None, force_terminal=False,
                      legacy_windows=False, record=True)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()
