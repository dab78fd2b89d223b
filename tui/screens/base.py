"""What every step screen shares: worker outcomes arrive in one place, and errors become a modal."""
from __future__ import annotations

import threading
from typing import Any

from headedit.tui.messages import reporter_for
from textual.screen import Screen
from textual.worker import Worker, WorkerState


class StepScreen(Screen):
    """A screen that runs library calls in thread workers.

    Workers are started with `exit_on_error=False`; their end (success or error) is routed by the single
    `on_worker_state_changed` below: success to `worker_done`, failure to `worker_failed`, which by default
    shows the error modal, so no library error can crash the app.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cancel_event = threading.Event()

    @property
    def reporter(self) -> Any:
        return reporter_for(self)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.SUCCESS:
            self.worker_done(worker.name, worker.result)
        elif event.state == WorkerState.ERROR:
            self.worker_failed(worker.name, worker.error)
        elif event.state == WorkerState.CANCELLED:
            self.worker_failed(worker.name, None)

    def worker_done(self, name: str, result: Any) -> None:
        """A worker finished; override to use its result."""

    def worker_failed(self, name: str, error: BaseException | None) -> None:
        """A worker failed (or was cancelled when `error` is None); default: show the error modal."""
        if error is not None:
            self.app.show_error(error)  # type: ignore[attr-defined]
