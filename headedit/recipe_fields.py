"""The recipe's field checkers: each reads one key, checks its type and range, and raises a RecipeError that
names the field (as text for people and as `field` for the TUI)."""
from __future__ import annotations

import math
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from headedit.errors import HeadeditError, RecipeError
from headedit.tasks import LM_EVAL_PREFIX, get_task, is_task_reference, task_from_fields

MAX_SIZE = 10_000_000  # sanity bound on any count; real limits come from the data and the model
_MEMORY = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")


class _Ctx:
    """Where we are in the file, so every error message starts with the recipe's name."""

    def __init__(self, path: Path | None) -> None:
        self.where = f"recipe {path.name}" if path is not None else "recipe"

    def fail(self, key: str, message: str, hint: str) -> RecipeError:
        return RecipeError(f"{self.where}: {key} {message}", hint, field=key.strip("[]"))


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


def _section(ctx: _Ctx, raw: Mapping[str, Any], key: str, allowed: tuple[str, ...], required: bool) -> dict:
    if key not in raw:
        if required:
            raise ctx.fail(f"[{key}]", "is missing", f"add a [{key}] table with at least " + ", ".join(allowed[:1]))
        return {}
    value = raw[key]
    if not isinstance(value, dict):
        raise ctx.fail(key, f"must be a table, got {_type_name(value)}", f"write [{key}] followed by its fields")
    _no_unknown(ctx, value, key + ".", allowed)
    return value


def _no_unknown(ctx: _Ctx, table: Mapping[str, Any], prefix: str, allowed: tuple[str, ...]) -> None:
    for key in table:
        if key not in allowed:
            raise ctx.fail(f"{prefix}{key}", "is not a recipe field", "allowed here: " + ", ".join(allowed))


def _get(ctx: _Ctx, table: Mapping[str, Any], key: str, prefix: str, check: Callable[[Any], Any],
         expected: str, default: Any = ..., example: str = "") -> Any:
    """Fetch `key`, check its type/range with `check` (returns the value or raises ValueError)."""
    dotted = prefix + key
    if key not in table:
        if default is ...:
            raise ctx.fail(dotted, "is missing", f"add {dotted.split('.')[-1]} = {example or expected}")
        return default
    value = table[key]
    try:
        return check(value)
    except (ValueError, TypeError):
        shown = _show(value)
        raise ctx.fail(dotted, f"must be {expected}, got {shown}", f"e.g. {dotted.split('.')[-1]} = {example or expected}") from None


def _show(value: Any) -> str:
    """A short rendering of a bad value: TOML spelling for scalars, the type for tables and arrays."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return _type_name(value)


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError
    return value


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options or not isinstance(value, str):
            raise ValueError
        return value
    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError
        return value
    return check


_positive = _int_range(1, MAX_SIZE)


def _float_range(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError
        if value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi):
            raise ValueError
        return float(value)
    return check


def _positive_or_auto(value: Any) -> int | str:
    return "auto" if value == "auto" and isinstance(value, str) else _positive(value)


def _pattern(regex: re.Pattern[str]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not regex.match(value):
            raise ValueError
        return value
    return check


def _task_names(ctx: _Ctx, key: str, value: Any, check_tasks: bool) -> Any:
    """Resolve a task name through the registry; returns the Task (or None when not checking)."""
    if not check_tasks:
        return None

    try:
        return get_task(value)
    except HeadeditError as err:

        if is_task_reference(value):  # a task file: its own error (file, key or line) says what is wrong
            raise ctx.fail(key, f"{value!r}: {err.message}", err.hint or "see `headedit tasks FILE`") from None
        raise ctx.fail(key, f"names unknown task {value!r}", err.hint or "see `headedit tasks`") from None


SHORTCUT_KEYS = ("data", "prompt", "choices", "label", "target")


def _choices(value: Any) -> tuple[str, ...] | str:
    if isinstance(value, str) and value.strip():
        return value
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(c, str) and c for c in value):
        raise ValueError
    return tuple(value)


def _task_fields(ctx: _Ctx, t: Mapping[str, Any], check_tasks: bool) -> tuple[str, Any, dict[str, Any]]:
    """task.name, the task (None when not checking) and the fields that define a task beyond a name."""
    p = "task."
    fields: dict[str, Any] = {
        "lm_eval": _get(ctx, t, "lm_eval", p, _string, "an lm-eval task name (string)", None, '"hellaswag"'),
        "include_path": _get(ctx, t, "include_path", p, _string, "a folder of lm-eval task YAMLs (string)", None,
                             '"my_tasks/"'),
        "data": _get(ctx, t, "data", p, _string, "a .jsonl or .csv file (string)", None, '"my_task.jsonl"'),
        "prompt": _get(ctx, t, "prompt", p, _string, "a template (string)", None, '"Question: {question}\\nAnswer:"'),
        "choices": _get(ctx, t, "choices", p, _choices, "a list of at least two strings, or a field name", None,
                        '[" no", " yes"]'),
        "label": _get(ctx, t, "label", p, _string, "the field holding the right choice's index (string)", None,
                      '"label"'),
        "target": _get(ctx, t, "target", p, _string, "a field name or a template (string)", None, '" {answer}"'),
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    if "include_path" in fields and "lm_eval" not in fields:
        raise ctx.fail("task.include_path", "needs task.lm_eval", 'name the task the folder defines: lm_eval = "..."')
    shortcut = [k for k in SHORTCUT_KEYS if k in fields]
    if "lm_eval" in fields and shortcut:
        raise ctx.fail(f"task.{shortcut[0]}", "cannot be combined with task.lm_eval",
                       "an lm-eval task brings its own data and prompts: keep one of them")
    if shortcut and "data" not in fields:
        raise ctx.fail(f"task.{shortcut[0]}", "needs task.data", 'add data = "FILE.jsonl" (or .csv)')
    if "lm_eval" in fields:

        default = LM_EVAL_PREFIX + fields["lm_eval"]
        name = _get(ctx, t, "name", p, _string, "a task name (string)", default, example=f'"{default}"')
        if name != default:
            raise ctx.fail("task.name", f"must be {default!r} with task.lm_eval (or left out)", f'name = "{default}"')
    else:
        name = _get(ctx, t, "name", p, _string, "a task name (string)", example='"arithmetic"')
    if not fields:
        return name, _task_names(ctx, "task.name", name, check_tasks), fields

    try:
        task = task_from_fields(name, fields, ctx.where, read=check_tasks)
    except HeadeditError as err:
        key = "task.lm_eval" if "lm_eval" in fields else next((f"task.{k}" for k in SHORTCUT_KEYS[1:]
                                                                 if f"task.{k}" in err.message), "task.data")
        message = err.message.removeprefix(f"{ctx.where}: ")
        if message.startswith(key + " "):
            raise ctx.fail(key, message[len(key) + 1:], err.hint or "") from None
        raise RecipeError(f"{ctx.where}: {key}: {message}", err.hint, field=key) from None
    return name, task, fields



def _fail() -> Any:
    raise ValueError



def _max_memory(value: Any) -> Mapping[str, str]:
    """accelerate's max_memory: keys are GPU indices or "cpu", values sizes with a unit."""
    if not isinstance(value, dict) or not value:
        raise ValueError
    for key, size in value.items():
        if not (key.isdigit() or key == "cpu") or not isinstance(size, str) or not _MEMORY.match(size.strip()):
            raise ValueError
    return MappingProxyType({k: v.strip() for k, v in value.items()})



def _string_list(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) and x.strip() for x in value):
        raise ValueError
    return list(value)



def _gguf_name(value: Any) -> str:
    if not isinstance(value, str) or not value.endswith(".gguf") or "/" in value or "\\" in value or len(value) > 255:
        _fail()
    return value

