"""What a task is: deterministic splits of examples with per-example correctness."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

TaskKind = Literal["choice", "exact", "generate"]
SplitName = Literal["discovery", "heldout"]


@dataclass(frozen=True)
class Example:
    index: int  # row in the source split, so results can be joined with the data
    prompt: str
    target: str | None = None  # exact-match continuation, e.g. " 46"
    choices: tuple[str, ...] = ()  # continuations for multiple choice
    label: int | None = None  # index of the correct choice
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Split:
    task: str
    name: SplitName
    examples: Sequence[Example]
    source: str  # where the rows came from, e.g. "google/boolq validation rows 2000-5269"
    note: str = ""  # e.g. "no train split found: discovery carved from validation"

    def __len__(self) -> int:
        return len(self.examples)


class Task:
    """Subclass per task. `load` must be deterministic in (split, size, seed, data_dir)."""

    name: str = ""
    kind: TaskKind = "exact"
    metric: str = "acc"  # acc | acc_norm | exact_match | pass@1
    dataset_id: str | None = None  # hub dataset id, for cards
    default_sizes: tuple[int, int] = (2000, 1000)  # (discovery, heldout)
    max_new_tokens: int = 32  # generated tasks
    stop: tuple[str, ...] = ()  # stop sequences for generated tasks
    length_normalize: bool = False  # choice tasks: acc_norm by byte length

    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        raise NotImplementedError

    def check(self, example: Example, generated: str) -> bool:
        """Generated tasks: is this continuation correct?"""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "metric": self.metric, "dataset_id": self.dataset_id}
