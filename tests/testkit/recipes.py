"""Recipe TOML built from sections, so a test names only the fields it is about.

Tests of the parser itself (tests/test_recipe.py, the bad-input corpus) keep their hand-written text: there the
text is the subject.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from headedit.toml_text import dumps_toml

Value = Union[str, int, float, bool, Path, list, tuple, None]


def _plain(fields: dict[str, Value]) -> dict[str, object]:
    return {k: v.as_posix() if isinstance(v, Path) else v for k, v in fields.items()}


def recipe_toml(name: str = "t", *, model: str | Path | dict[str, Value] = "headedit:demo",
                task: str | dict[str, Value] = "copy-second", discovery: dict[str, Value] | None = None,
                validation: dict[str, Value] | None = None, export: dict[str, Value] | None = None) -> str:
    """A recipe: `model` is an id or the [model] table, `task` a name or the [task] table; other tables only when
    given (fields set to None are left out, so the recipe's default applies)."""
    data: dict[str, object] = {"name": name,
                                "model": _plain(model if isinstance(model, dict) else {"id": model}),
                                "task": _plain(task if isinstance(task, dict) else {"name": task})}
    for table, fields in (("discovery", discovery), ("validation", validation), ("export", export)):
        if fields is not None:
            data[table] = _plain(fields)
    return dumps_toml(data)


def coin_recipe(model: Path, screen: str = "single", discovery: int = 192, heldout: int = 128, extra: str = "",
                name: str = "tiny-coin", side: str = "", objective: str = "accuracy", alpha: float = 1.0) -> str:
    """The pinned coin-test recipe of the pipeline tests. No head matters for coin-test, so under the default
    evidence rule nothing would be selected; tests that need a selection keep the old rule (accuracy, alpha = 1).
    `extra` is raw TOML appended to [discovery]; `side` the inside of `side_tasks = [...]`."""
    text = recipe_toml(name, model={"id": model, "dtype": "float32", "device": "cpu", "batch_size": 32},
                       task={"name": "coin-test", "discovery": discovery, "heldout": heldout, "seed": 0},
                       discovery={"screen": screen, "candidates": 6, "max_heads": 3, "beam": 2, "min_gain": 0.5,
                                  "objective": objective, "alpha": alpha})
    return text + extra + ("\n" if extra else "") + f"[validation]\nside_tasks = [{side}]\nbootstrap = 2000\n"


def default_recipe(model: Path, seed: int, discovery: int = 96, heldout: int = 16, **discovery_fields: Value) -> str:
    """coin-test on `model` with the recipe's own discovery defaults apart from `discovery_fields`."""
    return recipe_toml(f"noise-{seed}", model={"id": model, "dtype": "float32", "device": "cpu", "batch_size": 32},
                       task={"name": "coin-test", "discovery": discovery, "heldout": heldout, "seed": seed},
                       discovery=dict(discovery_fields))
