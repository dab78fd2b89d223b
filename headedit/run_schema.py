"""The shapes of the files in a run folder, checked whenever one is read.

Why a module of its own: a run folder is user-writable state that outlives the process that wrote it; it can be
edited by hand, copied between versions or truncated. Every file and journal row is checked here before anything
uses it (and before anything is written), so a wrong shape is one `RunError` line naming the file, never an
internal error half-way through a stage or a silently wrong result (journal bits padded with zeros).
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Callable

from headedit.errors import HeadSpecError, RunError
from headedit.model.heads import canonical_heads

MAX_RUN_FILE_BYTES = 64 * 2**20
MAX_RECIPE_BYTES = 1 * 2**20
_FIX = "delete that file to redo its stage (`headedit discover --resume RUN`), or start a new run"


def recipe_digest(text: str) -> str:
    """sha256 of a recipe's exact text: what run.json and the journal pin."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _fail(path: Path, what: str, hint: str = _FIX) -> RunError:
    return RunError(f"{path} {what}", hint)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_heads_text(path: Path, field: str, value: Any) -> str:
    """A head set as a run file stores it: canonical `L.H` text ('' = none)."""
    if not isinstance(value, str):
        raise _fail(path, f"has {field} of type {type(value).__name__}, not head-set text")
    try:
        canonical = canonical_heads(value)
    except HeadSpecError as err:
        raise _fail(path, f"has an invalid {field}: {err.message}") from None
    if canonical != value:
        raise _fail(path, f"has {field} {value[:60]!r}, not in canonical form")
    return value


def _object(path: Path, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _fail(path, f"is a JSON {type(data).__name__}, not an object")
    return data


def _numbers(path: Path, data: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in data and data[key] is not None and not _number(data[key]):
            raise _fail(path, f"has {key} = {str(data[key])[:40]!r}, not a number")


def check_run_info(path: Path, data: Any) -> dict[str, Any]:
    info = _object(path, data)
    if not _count(info.get("format")):
        raise _fail(path, "has no format number", "the run folder is corrupt; start a new run")
    for key in ("model", "task", "environment", "batch"):
        if key in info and not isinstance(info[key], dict):
            raise _fail(path, f"has {key} of type {type(info[key]).__name__}, not an object",
                        "the run folder is corrupt; start a new run")
    for key in ("name", "recipe_sha256", "created", "headedit_version"):
        if key in info and not isinstance(info[key], str):
            raise _fail(path, f"has {key} that is not text", "the run folder is corrupt; start a new run")
    task = info.get("task", {})
    if "name" in task and not isinstance(task["name"], str):
        raise _fail(path, "has a task name that is not text", "the run folder is corrupt; start a new run")
    return info


def check_selection(path: Path, data: Any) -> dict[str, Any]:
    record = _object(path, data)
    check_heads_text(path, "heads", record.get("heads"))
    _numbers(path, record, ("discovery_acc", "intact_acc", "gain_points", "n"))
    return record


def check_screen(path: Path, data: Any) -> dict[str, Any]:
    record = _object(path, data)
    for key in ("method", "rule"):
        if not isinstance(record.get(key), str):
            raise _fail(path, f"has no {key} text")
    for key in ("num_layers", "num_heads", "evaluations"):
        if not _count(record.get(key)):
            raise _fail(path, f"has {key} = {str(record.get(key))[:40]!r}, not a count")
    if not _number(record.get("intact_acc")):
        raise _fail(path, "has no intact_acc number")
    delta = record.get("delta")
    if (not isinstance(delta, list) or len(delta) != record["num_layers"]
            or not all(isinstance(row, list) and all(v is None or _number(v) for v in row) for row in delta)):
        raise _fail(path, "has a delta that is not one list of numbers per layer")
    return record


def check_search(path: Path, data: Any) -> dict[str, Any]:
    record = _object(path, data)
    if "trace" in record and not isinstance(record["trace"], list):
        raise _fail(path, "has a trace that is not a list")
    return record


def check_validation(path: Path, data: Any) -> dict[str, Any]:
    record = _object(path, data)
    if not isinstance(record.get("passed"), bool):
        raise _fail(path, "has no passed: true/false", "validate the run again: headedit validate RUN")
    check_heads_text(path, "heads", record.get("heads", ""))
    _numbers(path, record, ("intact_acc", "edited_acc", "gain_points", "mcnemar_p", "n"))
    return record


CHECKS: dict[str, Callable[[Path, Any], dict[str, Any]]] = {
    "run.json": check_run_info, "selection.json": check_selection, "screen.json": check_screen,
    "search.json": check_search, "validation.json": check_validation,
}


def check_row(path: Path, split: Any, heads: Any, n: Any, blob: Any, stage: Any, created: Any,
              values: Any = None) -> None:
    """One journal row: text keys, canonical heads, n >= 0 and blobs of exactly the length n implies
    (ceil(n / 8) bytes of bits; 4 n bytes of float32 objective values when present)."""
    where = f"journal row ({str(split)[:40]}, {str(heads)[:40]!r})"
    hint = "start a new run; the journal cannot be trusted"
    if not isinstance(split, str) or not split or not isinstance(stage, str) or not isinstance(created, str):
        raise _fail(path, f"{where} has a key or label that is not text", hint)
    if not isinstance(heads, str):
        raise _fail(path, f"{where} has heads that are not text", hint)
    try:
        canonical = canonical_heads(heads)
    except HeadSpecError:
        canonical = None
    if canonical != heads:
        raise _fail(path, f"{where} has heads that are not a canonical head set", hint)
    if not _count(n):
        raise _fail(path, f"{where} has n = {str(n)[:20]!r}, not a count", hint)
    if not isinstance(blob, bytes) or len(blob) != math.ceil(n / 8):
        size = len(blob) if isinstance(blob, bytes) else type(blob).__name__
        raise _fail(path, f"{where} holds {size} bytes of correctness bits for n = {n} examples", hint)
    if values is not None and (not isinstance(values, bytes) or len(values) != 4 * n):
        size = len(values) if isinstance(values, bytes) else type(values).__name__
        raise _fail(path, f"{where} holds {size} bytes of objective values for n = {n} examples", hint)


__all__ = ["CHECKS", "MAX_RECIPE_BYTES", "MAX_RUN_FILE_BYTES", "check_heads_text", "check_row", "check_run_info",
           "recipe_digest"]
