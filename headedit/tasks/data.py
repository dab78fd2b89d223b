"""Where task rows come from: local files in the hub's own schema, or `datasets` by hub id."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, Sequence

from headedit.errors import TaskError

DATA_DIR_ENV = "HEADEDIT_DATA_DIR"


def data_dir_from(data_dir: str | Path | None) -> Path | None:
    """Explicit folder first, then $HEADEDIT_DATA_DIR; None means 'use the hub through datasets'."""
    chosen = data_dir if data_dir else os.environ.get(DATA_DIR_ENV)
    return Path(chosen).expanduser() if chosen else None


def local_file(data_dir: Path | None, folder: str, split: str) -> Path | None:
    if data_dir is None:
        return None
    for ext in ("jsonl", "json"):
        path = data_dir / folder / f"{split}.{ext}"
        if path.is_file():
            return path
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise TaskError(f"{path.name} line {lineno} is not valid JSON: {err.msg}", "fix or re-export the file") from None
    return rows


def load_rows(
    dataset_id: str,
    split: str,
    folder: str,
    data_dir: str | Path | None = None,
    config: str | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Rows of `dataset_id`'s `split` and a description of where they came from.

    Local `{data_dir}/{folder}/{split}.jsonl` wins; otherwise `datasets.load_dataset(dataset_id, config)`.
    """
    directory = data_dir_from(data_dir)
    path = local_file(directory, folder, split)
    if path is not None:
        return read_jsonl(path), f"{dataset_id} {split} (local file {folder}/{path.name})"
    if directory is not None and (directory / folder).is_dir():
        raise TaskError(
            f"no {split} split of {dataset_id} in the local data folder ({folder}/{split}.jsonl missing)",
            f"add {folder}/{split}.jsonl in the hub schema, or unset {DATA_DIR_ENV} to use the hub",
        )
    from headedit.offline import hub_unreachable, offline_env

    offline = hub_unreachable()
    if offline and not offline_env():  # datasets would retry ~25 s; with HF_HUB_OFFLINE it reads its cache fast
        raise TaskError(
            f"cannot load {dataset_id} ({split}): {offline}",
            f"point --data-dir or {DATA_DIR_ENV} (or task.data_dir) at a folder with {folder}/{split}.jsonl, "
            "or set HF_HUB_OFFLINE=1 to use a datasets cache",
        )
    try:
        import datasets  # heavy; only when really going to the hub

        ds = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as err:  # offline, missing, or a hub error: all mean the same to the user
        raise TaskError(
            f"cannot load {dataset_id} ({split}) " + (f"from the datasets cache ({offline})" if offline else
                                                       f"from the hub: {type(err).__name__}"),
            f"offline? point {DATA_DIR_ENV} (or --data-dir / task.data_dir) at a folder with {folder}/{split}.jsonl",
        ) from None
    return [dict(row) for row in ds], f"{dataset_id} {split} (hub)"


def carve(rows: Sequence[Any], sizes: tuple[int, int], seed: int, which: int) -> list[int]:
    """Disjoint discovery/held-out row indices carved from one split by a seeded shuffle.

    `which` 0 = discovery, 1 = held-out. Deterministic in (len(rows), sizes, seed).
    """
    n_disc, n_held = sizes
    if n_disc + n_held > len(rows):
        raise TaskError(
            f"requested {n_disc} discovery + {n_held} held-out examples but only {len(rows)} rows exist",
            "lower task.discovery/task.heldout",
        )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    picked = order[:n_disc] if which == 0 else order[n_disc:n_disc + n_held]
    return sorted(picked)
