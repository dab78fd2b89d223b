"""Task registry. Tasks register themselves on import; `get_task` is the one way in.

Besides registered names (`task_names()`: the built-ins and plugins), `get_task` resolves task files: an
lm-eval YAML (`headedit.tasks.lmeval`), a TOML naming a JSONL/CSV file (`headedit.tasks.files`), or
`lm-eval:NAME` from lm-eval's own registry. A recipe's inline task fields register their task by name.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, Task
from headedit.tasks.registry import REGISTRY, load_all, register_task


def task_names() -> list[str]:
    load_all()
    return sorted(REGISTRY)


LM_EVAL_PREFIX = "lm-eval:"
TASK_FILE_SUFFIXES = (".yaml", ".yml", ".toml")
_FILES: dict[str, tuple[tuple, Task]] = {}  # reference -> (file stamp, task): task files are built once per version
_FROM_FIELDS: set[str] = set()  # names a recipe's task fields registered (they may be registered again)


def is_task_reference(name: str) -> bool:
    """Does `name` point at a task file or lm-eval's registry rather than a registered name?"""
    path = name.partition("#")[0]
    return name.startswith(LM_EVAL_PREFIX) or path.lower().endswith(TASK_FILE_SUFFIXES)


def get_task(name: str) -> Task:
    """A registered task by name; else a task file (`x.yaml[#metric[,filter]]` for lm-eval, `x.toml` for the
    JSONL/CSV shortcut) or `lm-eval:NAME` from lm-eval's registry, built once per file version."""
    load_all()
    if name in REGISTRY:
        return REGISTRY[name]
    if not is_task_reference(name):
        hint = "known tasks: " + ", ".join(sorted(REGISTRY)) + "; or a task file (.yaml for lm-eval, .toml)"
        if name.partition("#")[0].lower().endswith((".jsonl", ".json", ".csv", ".tsv")):
            hint = "a data file needs a prompt: name a task .toml with data, prompt and choices+label or target"
        raise TaskError(f"unknown task {name!r}", hint)
    path_text, _, fragment = name.partition("#")
    stamp: tuple = ()
    if not name.startswith(LM_EVAL_PREFIX):
        path = Path(path_text).expanduser()
        try:
            stat = path.stat()
        except OSError:
            raise TaskError(f"task file {path_text} not found", "check the path; relative paths start at the working folder") from None
        stamp = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    hit = _FILES.get(name)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    task = _build_reference(name, path_text, fragment)
    _FILES[name] = (stamp, task)
    return task


def _build_reference(name: str, path_text: str, fragment: str) -> Task:
    # Imported here: task files are optional and lm-eval is heavy; built-in names never load these modules.
    if name.startswith(LM_EVAL_PREFIX):
        # optional: task files need lm-eval (an extra); built-in names never load these modules
        from headedit.tasks.lmeval import LmEvalTask

        return LmEvalTask(name, lm_eval_name=path_text[len(LM_EVAL_PREFIX):], pick=fragment or None)
    path = Path(path_text).expanduser()
    if path.suffix.lower() == ".toml":
        # optional: task files need lm-eval (an extra); built-in names never load these modules
        from headedit.tasks.files import task_from_toml

        if fragment:
            raise TaskError(f"task file {path.name} takes no #{fragment}", "a JSONL/CSV task has one metric")
        return task_from_toml(path, name)
    # optional: task files need lm-eval (an extra); built-in names never load these modules
    from headedit.tasks.lmeval import LmEvalTask

    return LmEvalTask(name, path=path, pick=fragment or None)


def task_from_fields(name: str, fields: Mapping[str, Any], where: str, read: bool = True) -> Task | None:
    """The task a recipe's [task] table defines beyond a name (the JSONL/CSV shortcut, or `lm_eval` with
    `include_path`), registered under `name` so every stage's `get_task(name)` finds it in this process.

    `read=False` (schema-only parsing) registers a JSONL/CSV task without reading its rows, and builds no
    lm-eval task (that loads data): None then."""
    load_all()
    if not fields.get("lm_eval") and ((name in REGISTRY and name not in _FROM_FIELDS) or is_task_reference(name)):
        raise TaskError(f"{where}: task.name {name!r} is " + ("a built-in task" if name in REGISTRY else "a task file"),
                        'with task.data, give your task its own name, e.g. name = "support-intent"')
    _FROM_FIELDS.add(name)
    if fields.get("lm_eval"):
        # optional: task files need lm-eval (an extra); built-in names never load these modules
        from headedit.tasks.lmeval import LmEvalTask, require_lm_eval

        require_lm_eval(f"task.lm_eval {fields['lm_eval']!r}")
        if not read:
            return None
        task: Task = LmEvalTask(name, lm_eval_name=str(fields["lm_eval"]), include_path=fields.get("include_path"))
    else:
        # optional: task files need lm-eval (an extra); built-in names never load these modules
        from headedit.tasks.files import FileTask, spec_from_table

        task = FileTask(name, spec_from_table(fields, where), read=read)
    return register_task(task)


__all__ = ["Example", "Split", "Task", "get_task", "is_task_reference", "register_task", "task_from_fields",
           "task_names"]
