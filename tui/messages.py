"""Bridge from the library's typed events (emitted in worker threads) to Textual messages."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from headedit.events import Event


class PipelineEvent(Message):
    """One library event, delivered on the UI thread to the screen that started the work."""

    def __init__(self, event: "Event") -> None:
        self.event = event
        super().__init__()


def reporter_for(target: "MessagePump") -> Any:
    """A `Reporter` callable for the library: posts each event to `target` (post_message is thread-safe)."""

    def report(event: "Event") -> None:
        target.post_message(PipelineEvent(event))

    return report
