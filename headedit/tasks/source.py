"""Where a task comes from, as recorded in results JSON, runs and cards.

A built-in task is named by its registry name and hub dataset; a task file by its file *name* (never a local
path) and the sha256 of every file that decides its prompts: the task file, the YAML files it includes, the
Python modules its `!function` entries load, and its local data files. Two runs with the same hashes saw the
same task definition and the same rows.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from headedit.tasks.base import Task


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path) -> dict[str, str]:
    """{"file": name, "sha256": hash}: the name only, so a results file never carries a local path."""
    return {"file": path.name, "sha256": sha256_of(path)}


@dataclass(frozen=True)
class TaskSource:
    """Provenance of one task definition."""

    kind: str  # "builtin" | "lm-eval" | "file"
    reference: str  # what `get_task` resolves: "boolq", "tasks/x.yaml#acc_norm", "lm-eval:hellaswag", a name
    task_file: dict[str, str] | None = None  # {"file", "sha256"} of the task file itself
    files: tuple[dict[str, str], ...] = ()  # included YAMLs and `!function` modules
    data: tuple[dict[str, str], ...] = ()  # local data files
    details: dict[str, Any] = field(default_factory=dict)  # lm-eval task name, metric, filter, version, ...

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "reference": display_reference(self)}
        if self.task_file:
            out["task_file"] = dict(self.task_file)
        if self.files:
            out["files"] = [dict(f) for f in self.files]
        if self.data:
            out["data"] = [dict(d) for d in self.data]
        out.update(self.details)
        return out


def display_reference(source: TaskSource) -> str:
    """The reference with any folder part dropped (a card or shared JSON must not show local paths)."""
    if source.kind == "builtin" or source.task_file is None:
        return source.reference
    name, _, fragment = source.reference.partition("#")
    return Path(name).name + (f"#{fragment}" if fragment else "")


def task_source(task: Task) -> dict[str, Any]:
    """The provenance dict of any task: task files describe themselves, built-ins by name and dataset."""
    own = getattr(task, "source", None)
    if callable(own):
        found = own()
        if isinstance(found, TaskSource):
            return found.to_dict()
    return TaskSource("builtin", task.name, details={"dataset_id": task.dataset_id}).to_dict()


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Installed versions of the packages that decide a result (missing ones are left out)."""
    out: dict[str, str] = {}
    for pkg in ("headedit", "torch", "transformers", "tokenizers", "numpy", "datasets", "lm-eval") + extra:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out
