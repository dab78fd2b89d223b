"""The registry of named tasks: built-ins and plugins register themselves here on import.

Separate from `headedit.tasks` (which also resolves task files) so a task module can register itself without
importing the package that imports it back.
"""
from __future__ import annotations

from headedit.tasks.base import Task

REGISTRY: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    REGISTRY[task.name] = task
    return task


def load_all() -> None:
    """Import the built-in task modules and every `headedit.tasks` entry point once (they register on import)."""
    # Imported lazily so a broken optional task never breaks `import headedit`.
    import importlib

    for module in ("arithmetic", "boolq", "hellaswag", "mbpp", "gsm8k"):
        name = f"headedit.tasks.{module}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
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


__all__ = ["REGISTRY", "load_all", "register_task"]
