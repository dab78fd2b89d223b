"""Shared fixtures for the TUI tests: async tests run on asyncio through anyio's pytest plugin."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny Llama saved as safetensors with its tokenizer."""
    from headedit.bench.tiny import tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


async def wait_workers(pilot) -> None:
    """Until every worker has ended (failed ones included: their errors go to the app's modal)."""
    from textual.worker import WorkerState

    await pilot.pause()
    while any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in pilot.app.workers):
        await pilot.pause(0.05)
    await pilot.pause()
