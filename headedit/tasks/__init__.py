"""Task registry. Tasks register themselves on import; `get_task` is the one way in."""
from __future__ import annotations

from ..errors import TaskError
from .base import Example, Split, Task

_REGISTRY: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    _REGISTRY[task.name] = task
    return task


def _load_builtin() -> None:
    # Imported lazily so a broken optional task never breaks `import headedit`.
    import importlib

    for module in ("arithmetic", "boolq", "hellaswag", "mbpp", "gsm8k"):
        try:
            importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{module}":
                raise
    for module in ("headedit.demo.tasks", "headedit.demo.addsub_data"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise


def task_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_task(name: str) -> Task:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise TaskError(f"unknown task {name!r}", "known tasks: " + ", ".join(sorted(_REGISTRY))) from None


__all__ = ["Example", "Split", "Task", "get_task", "register_task", "task_names"]
