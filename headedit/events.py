"""Typed progress events: the library emits them, the CLI renders them with rich, the TUI turns them into messages."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union


@dataclass(frozen=True)
class StageStarted:
    stage: str  # e.g. "screen:single", "search", "bake", "validate"
    total: int | None = None  # number of work units, when known
    description: str = ""


@dataclass(frozen=True)
class StageProgress:
    stage: str
    done: int
    total: int | None = None


@dataclass(frozen=True)
class StageFinished:
    stage: str
    summary: str = ""


@dataclass(frozen=True)
class HeadScored:
    """One head's screen result, so a heatmap can fill in as results arrive."""

    stage: str
    layer: int
    head: int
    delta: float  # change in discovery accuracy (points) or predicted change
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SetEvaluated:
    """One ablation set evaluated (or reused from the journal)."""

    stage: str
    heads: str  # canonical head-set text
    accuracy: float
    n: int
    cached: bool = False


@dataclass(frozen=True)
class Log:
    message: str
    level: str = "info"


Event = Union[StageStarted, StageProgress, StageFinished, HeadScored, SetEvaluated, Log]
Reporter = Callable[[Event], None]


def null_reporter(event: Event) -> None:
    """Default reporter: drop events."""
    return None
