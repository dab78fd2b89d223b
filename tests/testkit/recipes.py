"""Recipe TOML built from sections, so a test names only the fields it is about.

Tests of the parser itself (tests/test_recipe.py, the bad-input corpus) keep their hand-written text: there the
text is the subject.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

Value = Union[str, int, float, bool, Path, list, tuple]


def _value(v: Value) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, Path):
        return json.dumps(v.as_posix())
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(v)


def _section(name: str, fields: dict[str, Value]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in fields.items() if v is not None)


def recipe_toml(name: str = "t", *, model: str | Path | dict[str, Value] = "headedit:demo",
                task: str | dict[str, Value] = "copy-second", discovery: dict[str, Value] | None = None,
                validation: dict[str, Value] | None = None, export: dict[str, Value] | None = None) -> str:
    """A recipe: `model` is an id or the [model] table, `task` a name or the [task] table; other tables only when
    given (fields set to None are left out, so the recipe's default applies)."""
    model_fields = model if isinstance(model, dict) else {"id": model}
    task_fields = task if isinstance(task, dict) else {"name": task}
    parts = [f"name = {_value(name)}\n", _section("model", model_fields), _section("task", task_fields)]
    for table, fields in (("discovery", discovery), ("validation", validation), ("export", export)):
        if fields is not None:
            parts.append(_section(table, fields))
    return "".join(parts)


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
