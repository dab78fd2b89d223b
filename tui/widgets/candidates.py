"""The search trace as a sortable table: head set, size, discovery accuracy, gain, and n, the examples each
row was scored on (the search's pruning stops hopeless sets after 32, 64, ... examples; their n is smaller
and dimmed, so a 64-row score is never mistaken for a full-split one)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable

COLUMNS = (("heads", "heads"), ("size", "size"), ("acc", "acc"), ("gain", "gain"), ("n", "n"), ("note", ""))
SORT_KEYS = ("gain", "size", "acc", "n", "heads")
SEARCH_MARK, HAND_MARK = "★", "✎"  # the search's choice; a set made and evaluated by hand
LEGEND = f"{SEARCH_MARK} search  {HAND_MARK} hand-made  dim n: pruned"


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
        self.full_n: int | None = None
        self.rows_data: dict[str, dict[str, Any]] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def load_trace(self, trace: Iterable[dict[str, Any]], chosen: str | None = None,
                   full_n: int | None = None) -> None:
        """Fill from `search.json`'s trace; `chosen` (selection.json's heads) is marked; a row without its own
        `n` was scored on the whole discovery split, `full_n` examples."""
        self.clear()
        self.rows_data.clear()
        self.chosen = chosen
        self.full_n = full_n
        for entry in trace:
            self.add_set(entry["heads"], int(entry.get("size", 0)), entry.get("acc"), entry.get("gain"),
                         n=entry.get("n", full_n))
        self._apply_sort()

    def add_set(self, heads: str, size: int, acc: float | None, gain: float | None, note: str = "",
                n: int | None = None) -> None:
        """Add (or update) one head set's row; `n` is the number of examples it was scored on."""
        if heads == self.chosen and not note:
            note = SEARCH_MARK
        row = {"heads": heads, "size": size, "acc": acc, "gain": gain, "n": n, "note": note}
        partial = n is not None and self.full_n is not None and n < self.full_n
        cells = (
            heads or "(intact)",
            str(size),
            "—" if acc is None else f"{acc:.3f}",
            Text("—" if gain is None else f"{gain:+.1f}", style="green" if (gain or 0) > 0 else ""),
            Text("—" if n is None else str(n), style="dim" if partial else ""),
            note,
        )
        if heads in self.rows_data:
            for (key, _), value in zip(COLUMNS, cells, strict=True):
                self.update_cell(heads, key, value)
        else:
            self.add_row(*cells, key=heads)
        self.rows_data[heads] = row

    @property
    def sort_key(self) -> str:
        return SORT_KEYS[self.sort_index]

    def _apply_sort(self) -> None:
        """Order rows by the sort column's raw value (not its rendered text); ties keep size order. By gain or
        accuracy, rows scored on fewer examples than the split come after the full ones, as the search ranks them."""
        key, data, full_n = self.sort_key, self.rows_data, self.full_n

        def value(label: object) -> tuple:
            row = data.get("" if str(label) == "(intact)" else str(label), {})
            v = row.get(key)
            if key == "heads":
                return (str(v or ""),)
            missing = v is None
            n = row.get("n")
            partial = key in ("gain", "acc") and n is not None and full_n is not None and n < full_n
            sign = -1 if self.sort_reverse else 1
            return (missing, partial, sign * (0.0 if v is None else float(v)), row.get("size", 0))

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
        # every row is added with its head set (a str) as key, so RowKey.value is never None here
        return [cast(str, self.coordinate_to_cell_key(Coordinate(i, 0))[0].value) for i in range(self.row_count)]
