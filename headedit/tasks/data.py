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
    """One JSON object per line; a line that is not UTF-8, not JSON, nested absurdly deep or not an object, and a
    file without rows, are each one TaskError naming the file and line."""
    rows: list[dict[str, Any]] = []
    fix = "fix or re-export the file: one JSON object per line, UTF-8"
    try:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    raise TaskError(f"{path.name} line {lineno} is not UTF-8 text", fix) from None
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise TaskError(f"{path.name} line {lineno} is not valid JSON: {err.msg}", fix) from None
                except RecursionError:
                    raise TaskError(f"{path.name} line {lineno} is nested too deeply to be a data row", fix) from None
                if not isinstance(row, dict):
                    raise TaskError(f"{path.name} line {lineno} is a JSON {type(row).__name__}, not an object", fix)
                rows.append(row)
    except OSError as err:
        raise TaskError(f"cannot read {path} ({err.strerror or err})", "check the data folder") from None
    if not rows:
        raise TaskError(f"{path} holds no rows", "fill it with the split's rows, or remove it to use the hub")
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
    # lazy: only a Hub lookup needs the network probe
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
