"""BoolQ (google/boolq) as lm-eval scores it: `{passage}\\nQuestion: {question}?\\nAnswer:`, ` no`/` yes`, acc.

Discovery comes from train and held-out from validation. Without a train split (the local copy has only
validation) both are carved from validation without overlap: a seeded shuffle gives discovery the first
min(2000, n/2) rows and held-out the rest; `Split.note` says so.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.data import data_dir_from, load_rows, local_file
from headedit.tasks.registry import register_task


def pick(n_rows: int, size: int | None, seed: int, what: str) -> list[int]:
    """`size` seeded rows of a split (all rows, in order, when size is None or the whole split)."""
    if size is None or size == n_rows:
        return list(range(n_rows))
    if size > n_rows:
        raise TaskError(f"requested {size} {what} examples but only {n_rows} rows exist", "lower the size")
    order = list(range(n_rows))
    random.Random(seed).shuffle(order)
    return sorted(order[:size])


def train_or_carve(
    task: Task, folder: str, split: SplitName, size: int | None, seed: int, data_dir: Path | None,
    train: str = "train", validation: str = "validation", config: str | None = None,
) -> tuple[list[dict[str, Any]], list[int], str, str]:
    """(rows, picked row indices, source text, note) for discovery/held-out; carves when train is missing."""
    if split not in ("discovery", "heldout"):
        raise TaskError(f"unknown split {split!r}", "use discovery or heldout")
    assert task.dataset_id
    directory = data_dir_from(data_dir)
    train_missing = directory is not None and (directory / folder).is_dir() and local_file(directory, folder, train) is None
    if not train_missing:
        which = train if split == "discovery" else validation
        rows, source = load_rows(task.dataset_id, which, folder, data_dir, config)
        idx = pick(len(rows), size if size is not None else (task.default_sizes[0] if split == "discovery" else None), seed, split)
        return rows, idx, f"{source} rows", ""
    rows, source = load_rows(task.dataset_id, validation, folder, data_dir, config)
    pool = min(task.default_sizes[0], len(rows) // 2)
    order = list(range(len(rows)))
    random.Random(f"carve:{seed}").shuffle(order)
    part = order[:pool] if split == "discovery" else order[pool:]
    n = len(part) if size is None else size
    if n > len(part):
        raise TaskError(
            f"requested {n} {split} examples but only {len(part)} exist: no {train} split, so {validation} "
            f"({len(rows)} rows) is carved {pool}/{len(rows) - pool}",
            f"lower the size, or add {folder}/{train}.jsonl",
        )
    note = (f"no {train} split found: discovery ({pool} rows) and held-out ({len(rows) - pool} rows) carved "
            f"without overlap from {validation} by a seeded shuffle (seed {seed})")
    return rows, sorted(part[:n]), f"{source} rows", note


class BoolQTask(Task):
    name = "boolq"
    kind = "choice"
    metric = "acc"
    dataset_id = "google/boolq"
    default_sizes = (2000, 3270)

    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        rows, idx, source, note = train_or_carve(self, "boolq", split, size, seed, data_dir)
        examples = [self.example(i, rows[i]) for i in idx]
        return Split(self.name, split, examples, source, note)

    @staticmethod
    def example(index: int, row: dict[str, Any]) -> Example:
        try:
            prompt = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
            label = int(bool(row["answer"]))
        except KeyError as err:
            raise TaskError(f"boolq row {index} lacks field {err}", "rows need passage, question, answer") from None
        return Example(index, prompt, choices=(" no", " yes"), label=label)


register_task(BoolQTask())
