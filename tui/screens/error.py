"""Error modal: a HeadeditError's message and hint; anything else as a one-line internal error."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from headedit.errors import HeadeditError


def describe(error: BaseException) -> tuple[str, str, str | None]:
    """(title, message, hint) for an exception, as the CLI would print it on one line."""
    if isinstance(error, HeadeditError):
        return "Error", error.message, error.hint
    first = str(error).splitlines()[0] if str(error) else ""
    return "Internal error", f"{type(error).__name__}: {first}", "this is a bug in headedit; the run folder is kept"


class ErrorModal(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter", "dismiss_modal", "Close")]

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.title_text, self.message, self.hint = describe(error)

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Static(self.title_text, id="error-title")
            yield Static(self.message, id="error-message", markup=False)
            if self.hint:
                yield Static(self.hint, id="error-hint", markup=False)
            yield Button("OK", id="error-ok", variant="error")

    def on_mount(self) -> None:
        self.query_one(Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_dismiss_modal(self) -> None:
        self.dismiss(None)
