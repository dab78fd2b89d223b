"""The search trace as a sortable table: head set, size, discovery accuracy, gain."""
from __future__ import annotations

from typing import Any, Iterable

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

COLUMNS = (("heads", "head set"), ("size", "size"), ("acc", "disc. acc"), ("gain", "gain (pts)"), ("note", ""))
SORT_KEYS = ("gain", "size", "acc", "heads")


class CandidateTable(DataTable):
    """Rows keyed by canonical head-set text; `s` cycles the sort column, `r` reverses it."""

    BINDINGS = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("r", "reverse_sort", "Reverse", show=False),
    ]

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.sort_index = 0
        self.sort_reverse = True
        self.chosen: str | None = None
        self.rows_data: dict[str, dict[str, Any]] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def load_trace(self, trace: Iterable[dict[str, Any]], chosen: str | None = None) -> None:
        """Fill from `search.json`'s trace; `chosen` (selection.json's heads) is marked."""
        self.clear()
        self.rows_data.clear()
        self.chosen = chosen
        for entry in trace:
            self.add_set(entry["heads"], int(entry.get("size", 0)), entry.get("acc"), entry.get("gain"))
        self._apply_sort()

    def add_set(self, heads: str, size: int, acc: float | None, gain: float | None, note: str = "") -> None:
        """Add (or update) one head set's row."""
        if heads == self.chosen and not note:
            note = "★ search"
        row = {"heads": heads, "size": size, "acc": acc, "gain": gain, "note": note}
        cells = (
            heads or "(intact)",
            str(size),
            "—" if acc is None else f"{acc:.3f}",
            Text("—" if gain is None else f"{gain:+.1f}", style="green" if (gain or 0) > 0 else ""),
            note,
        )
        if heads in self.rows_data:
            for (key, _), value in zip(COLUMNS, cells):
                self.update_cell(heads, key, value)
        else:
            self.add_row(*cells, key=heads)
        self.rows_data[heads] = row

    @property
    def sort_key(self) -> str:
        return SORT_KEYS[self.sort_index]

    def _apply_sort(self) -> None:
        """Order rows by the sort column's raw value (not its rendered text); ties keep size order."""
        key, data = self.sort_key, self.rows_data

        def value(label: object) -> tuple:
            row = data.get("" if str(label) == "(intact)" else str(label), {})
            v = row.get(key)
            if key == "heads":
                return (str(v or ""),)
            missing = v is None
            sign = -1 if self.sort_reverse else 1
            return (missing, sign * (0.0 if missing else float(v)), row.get("size", 0))

        self.sort("heads", key=value)

    def action_cycle_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORT_KEYS)
        self.sort_reverse = True
        self._apply_sort()
        self.notify(f"sorted by {self.sort_key}", timeout=2)

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._apply_sort()

    @property
    def cursor_heads(self) -> str | None:
        """Head set of the row under the cursor."""
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value

    @property
    def ordered_heads(self) -> list[str]:
        return [self.coordinate_to_cell_key((i, 0))[0].value for i in range(self.row_count)]
