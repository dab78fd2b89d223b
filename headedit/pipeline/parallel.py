"""Processes and placement for discovery over several processes (`torchrun --nproc_per_node N -m headedit discover ...`).

Ablation sets are independent, so every process holds a model replica (or a slice of GPUs through a
`device_map`), runs the same deterministic discovery loop, and evaluates only its share of each call's sets;
the bits are gathered to every process, so all of them take the same decisions. Only rank 0 touches the run
folder: it holds the lock, writes the one journal and every result file, and at the start broadcasts what the
folder already holds (recipe, journal rows, finished stage files). The journal is keyed by head set, never by
rank, so a run resumes with any number of processes. Launch: torchrun sets RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT; CUDA ranks talk over NCCL, CPU ranks over gloo.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from headedit.errors import HeadeditError, RunError
from headedit.journal import Entry, extend_entry
from headedit.runs import SCREEN_FILE, SEARCH_FILE, SELECTION_FILE

STAGE_FILES = (SCREEN_FILE, SEARCH_FILE, SELECTION_FILE)


# ---- who am I -----------------------------------------------------------------------------------
def world_size() -> int:
    """Processes in this launch (torchrun's WORLD_SIZE; 1 when not launched by torchrun)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:  # pragma: no cover
        pass
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    """Only rank 0 prints results and writes run files."""
    return rank() == 0


def active() -> bool:
    """True when this process is one of several (so discovery must shard and gather)."""
    return world_size() > 1


def share(count: int, rank_: int, world: int) -> tuple[int, int]:
    """Contiguous [lo, hi) slice of `count` sets for `rank_`: sizes differ by at most one.

    Contiguous (not strided) so a process's sets share their lowest ablated layer as often as possible,
    which is what the engine's prefix reuse pays off on.
    """
    base, extra = divmod(count, world)
    lo = rank_ * base + min(rank_, extra)
    return lo, lo + base + (1 if rank_ < extra else 0)


# ---- where the model goes -------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where one process puts its model: a device, or a `device_map="auto"` over some GPUs and a budget."""

    device: str  # the device inputs go to ("cpu", "cuda:3")
    device_map: str | None = None  # "auto" when the model is spread over several devices
    max_memory: Mapping[Any, str] | None = None  # accelerate's budget, keys GPU index or "cpu"

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"


def _memory_keys(max_memory: Mapping[str, str]) -> dict[Any, str]:
    """Recipe keys are strings ("0", "cpu"); accelerate wants GPU indices as ints."""
    return {int(k) if str(k).isdigit() else str(k): str(v) for k, v in max_memory.items()}


def place(device: str, max_memory: Mapping[str, str] | None, local_rank: int, local_world: int,
          gpu_count: int) -> Placement:
    """This process's placement from the recipe's device/max_memory, its local rank and the visible GPUs.

    One process, no budget: the recipe's device. A `max_memory` budget spreads the model over the GPUs it
    names (device_map="auto"). Several processes on a node split the visible GPUs evenly: with one GPU each,
    a replica per GPU; with several each, every process spreads its replica over its own slice.
    """
    if device == "cpu" or (device == "auto" and gpu_count == 0):
        if max_memory:
            raise RunError("model.max_memory needs CUDA GPUs", "remove max_memory or run on a GPU machine")
        return Placement("cpu")
    if device.startswith("cuda") and gpu_count == 0:
        raise RunError(f"model.device is {device} but no CUDA GPU is visible", 'set device = "auto" or "cpu"')
    budget = _memory_keys(max_memory) if max_memory else None
    if local_world <= 1:
        if budget is None:
            return Placement("cuda:0" if device in ("auto", "cuda") else device)
        gpus = sorted(k for k in budget if isinstance(k, int))
        if any(g >= gpu_count for g in gpus):
            raise RunError(f"model.max_memory names GPU {max(gpus)} but only {gpu_count} are visible",
                           "name GPUs 0.." + str(gpu_count - 1))
        return Placement(f"cuda:{gpus[0]}" if gpus else "cpu", "auto", budget)
    if gpu_count < local_world:
        raise RunError(f"{local_world} processes on this node but only {gpu_count} GPUs",
                       f"launch at most {gpu_count} processes per node (torchrun --nproc_per_node {gpu_count})")
    per = gpu_count // local_world
    mine = list(range(local_rank * per, (local_rank + 1) * per))
    if per == 1 and budget is None:
        return Placement(f"cuda:{mine[0]}")
    limit = budget or {}
    slice_budget: dict[Any, str] = {g: limit.get(g, limit.get(0, "100%")) for g in mine}
    slice_budget = {g: v for g, v in slice_budget.items() if v != "100%"} or None  # type: ignore[assignment]
    if slice_budget is None:  # no budget: accelerate fills these GPUs only
        slice_budget = {g: _gpu_total(g) for g in mine}
    if "cpu" in limit:
        slice_budget["cpu"] = limit["cpu"]
    return Placement(f"cuda:{mine[0]}", "auto", slice_budget)


def _gpu_total(index: int) -> str:
    import torch

    return f"{torch.cuda.get_device_properties(index).total_memory // 2**20}MiB"


def placement_for(model_spec: Any) -> Placement:
    """`place` for this process (env LOCAL_RANK / LOCAL_WORLD_SIZE, visible CUDA GPUs)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) if active() else 1
    return place(model_spec.device, getattr(model_spec, "max_memory", None), int(os.environ.get("LOCAL_RANK", "0")),
                 local_world, gpus)


# ---- collectives ----------------------------------------------------------------------------------
def init_process_group(backend: str) -> None:
    """Join torchrun's process group once (env:// rendezvous)."""
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            if key not in os.environ:
                raise RunError(f"several processes need {key} in the environment", "launch with torchrun --nproc_per_node N")
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))


def broadcast(obj: Any, device: str) -> Any:
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, device=_comm_device(device))
    return box[0]


def _comm_device(device: str) -> Any:
    import torch

    return torch.device(device) if device.startswith("cuda") else None


class Shard:
    """Wraps an evaluator so each process computes a contiguous share of the sets and all get every row.

    A failure or a cancel on any process is seen by all of them at the same collective, so no process is
    left waiting: every process raises the same error.
    """

    def __init__(self, device: str, cancel: threading.Event | None = None) -> None:
        self.device = device
        self.rank = rank()
        self.world_size = world_size()
        self.cancel = cancel
        self.calls = 0
        self.sets_here = 0  # sets this process evaluated

    def wrap(self, eval_fn: Callable[[list, int, int], Any], with_values: bool = False) -> Callable[[list, int, int], Any]:
        """`with_values`: eval_fn returns (bits, float values) and so does the wrapper (a continuous objective)."""
        import torch.distributed as dist

        # lazy: loaded on first use
        from headedit.discovery.scorer import Cancelled

        def sharded(sets: list, start: int, stop: int) -> Any:
            cancelled = bool(self.cancel is not None and self.cancel.is_set())
            flags: list[Any] = [None] * self.world_size
            dist.all_gather_object(flags, cancelled)
            if any(flags):
                raise Cancelled("run cancelled; every finished evaluation is saved",
                                "resume with `headedit discover --resume RUN` (any number of processes)")
            lo, hi = share(len(sets), self.rank, self.world_size)
            error: str | None = None
            mine = np.zeros((hi - lo, stop - start), dtype=bool)  # [my sets, examples]
            values = np.zeros((hi - lo, stop - start), dtype=np.float32)  # [my sets, examples]
            try:
                if hi > lo:
                    out = eval_fn(sets[lo:hi], start, stop)
                    if with_values:
                        mine, values = np.asarray(out[0], dtype=bool), np.asarray(out[1], dtype=np.float32)
                    else:
                        mine = np.asarray(out, dtype=bool)
            except HeadeditError as err:
                error = str(err)
            except Exception as err:  # noqa: BLE001 - reported on every rank, then raised
                error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            parts: list[Any] = [None] * self.world_size
            dist.all_gather_object(parts, (error, np.packbits(mine, axis=1), mine.shape,
                                           values if with_values else None))
            failed = [(r, e) for r, (e, _, _, _) in enumerate(parts) if e]
            if failed:
                r, e = failed[0]
                raise RunError(f"process {r} of {self.world_size} failed: {e}",
                               "fix the cause and resume; finished evaluations are in the journal")
            self.calls += 1
            self.sets_here += hi - lo
            rows = [np.unpackbits(p, axis=1, count=shape[1]).astype(bool).reshape(shape) for _, p, shape, _ in parts]
            bits = np.concatenate(rows, axis=0)  # [sets, examples], in the callers' set order
            if not with_values:
                return bits
            return bits, np.concatenate([v for _, _, _, v in parts], axis=0)  # [sets, examples] float32

        return sharded


class MirrorJournal:
    """What a non-zero rank keeps instead of the SQLite journal: the same rows, in memory only.

    Every rank puts the same gathered bits in the same order, so this mirror and rank 0's journal agree.
    """

    def __init__(self, entries: list[Entry]) -> None:
        self._cache = {(e.split, e.heads): e for e in entries}

    def get(self, split: str, heads: str) -> Entry | None:
        return self._cache.get((split, heads))

    def put(self, split: str, heads: str, bits: np.ndarray, stage: str, new_examples: int,
            values: np.ndarray | None = None) -> Entry:
        entry = extend_entry(self._cache.get((split, heads)), split, heads, bits, stage, values)
        self._cache[(split, heads)] = entry
        return entry

    def entries(self, split: str | None = None) -> list[Entry]:
        return [e for e in self._cache.values() if split is None or e.split == split]

    def close(self) -> None:
        pass


class RunMirror:
    """What a non-zero rank sees of the run folder: rank 0's snapshot of it; writes go nowhere."""

    def __init__(self, path: str, info: dict[str, Any], files: dict[str, Any]) -> None:
        self.path = Path(path)
        self.info = info
        self._files = files

    def has(self, name: str) -> bool:
        return name in self._files

    def read(self, name: str) -> Any:
        return self._files[name]

    def write(self, name: str, data: Any) -> None:
        self._files[name] = data

    def update_info(self, **fields: Any) -> None:
        self.info.update(fields)


__all__ = ["world_size", "rank", "is_main_process", "active", "share", "Placement", "place", "placement_for",
           "Shard", "MirrorJournal", "RunMirror", "STAGE_FILES"]
