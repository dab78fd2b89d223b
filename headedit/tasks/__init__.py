"""Task registry. Tasks register themselves on import; `get_task` is the one way in."""
from __future__ import annotations

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, Task

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
    # Task plugins (the bundled demo among them) register through the `headedit.tasks` entry-point group, so
    # the core never names them; a third-party package adds tasks the same way.
    from importlib.metadata import entry_points

    for point in entry_points(group="headedit.tasks"):
        try:
            point.load()
        except ModuleNotFoundError as err:
            if err.name != point.value:
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
