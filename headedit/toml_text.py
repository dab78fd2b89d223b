"""The one TOML writer: recipes hold only strings, numbers, booleans, arrays and inline tables, so a few lines do
(the TUI's form writes recipes with it; tomllib only reads)."""
from __future__ import annotations

import json
import re
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps_toml(data: dict[str, Any]) -> str:
    """Top-level scalars first, then one [table] per dict value (its None fields left out: the default applies)."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{_key(section)}]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"
