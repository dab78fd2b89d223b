"""An Input for head-set text (`0.1,1.2`, `4.*`, `2.0-3`) that leaves every other key to the screen.

A plain Input swallows every printable key, so a screen's one-letter bindings (`e` evaluate, `b` bake) were
typed into it instead (`malformed head '1.1 e'`). Head sets use only digits and `. , * -` and spaces; any other
key is not consumed here: it bubbles to the screen's bindings, and the footer keeps showing them.
"""
from __future__ import annotations

import re

from textual import events
from textual.widgets import Input

HEAD_CHARS = re.compile(r"[0-9.,*\- ]")


class HeadSetInput(Input):
    def __init__(self, value: str = "", *, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(value, placeholder=placeholder, id=id, compact=True, restrict=r"[0-9.,*\- ]*")

    def check_consume_key(self, key: str, character: str | None) -> bool:
        """Only head-set characters are typed; other keys stay bound (Textual filters bindings by this)."""
        return character is not None and HEAD_CHARS.fullmatch(character) is not None

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and not self.check_consume_key(event.key, event.character):
            event.prevent_default()  # skip Input's typing handler; the key still bubbles to the bindings
