"""The screen's result: one number per head in a layer x head table, plus how it was obtained."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headedit.model.heads import Head


@dataclass
class ScreenResult:
    method: str  # single | compressed | gradient
    rule: str  # how the numbers were obtained and how candidates are ranked, in words
    num_layers: int
    num_heads: int
    intact_acc: float  # discovery accuracy of the intact model (fraction)
    delta: list[list[float]]  # [layer][head]: accuracy change in points, or the predicted change
    evaluations: int  # head sets evaluated on the discovery split by this screen
    unit: str = "points"
    complete: list[list[bool]] | None = None  # [layer][head]; False = early-stopped (single screen)
    extra: dict[str, Any] = field(default_factory=dict)

    def score(self, head: Head) -> float:
        return self.delta[head.layer][head.head]

    def is_complete(self, head: Head) -> bool:
        return True if self.complete is None else bool(self.complete[head.layer][head.head])

    def ranked(self) -> list[Head]:
        """All heads, best first: completed before early-stopped, then by score, ties by (layer, head)."""
        heads = [Head(layer, h) for layer in range(self.num_layers) for h in range(self.num_heads)]
        return sorted(heads, key=lambda x: (not self.is_complete(x), -self.score(x), x.layer, x.head))

    def top(self, k: int) -> list[Head]:
        """The k highest-scoring heads, even where their scores are zero or negative (pairs can help)."""
        return self.ranked()[: max(0, k)]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "method": self.method, "rule": self.rule, "num_layers": self.num_layers, "num_heads": self.num_heads,
            "intact_acc": self.intact_acc, "delta": self.delta, "evaluations": self.evaluations, "unit": self.unit,
        }
        if self.complete is not None:
            data["complete"] = self.complete
        data.update(self.extra)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ScreenResult":
        known = {"method", "rule", "num_layers", "num_heads", "intact_acc", "delta", "evaluations", "unit", "complete"}
        return cls(
            method=data["method"], rule=data["rule"], num_layers=int(data["num_layers"]),
            num_heads=int(data["num_heads"]), intact_acc=float(data["intact_acc"]),
            delta=[[float(v) for v in row] for row in data["delta"]], evaluations=int(data["evaluations"]),
            unit=data.get("unit", "points"), complete=data.get("complete"),
            extra={k: v for k, v in data.items() if k not in known},
        )


def topk_overlap(a: ScreenResult, b: ScreenResult, k: int) -> float:
    """Share of a's top-k heads that are also in b's top-k (how well two screens agree)."""
    if k <= 0:
        return 1.0
    return len(set(a.top(k)) & set(b.top(k))) / k
