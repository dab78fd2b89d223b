"""Automatic batch size: the largest batch that fits, found once by probing and kept in the run folder.

`model.batch_size = "auto"` on CUDA probes the real engine on the split's longest examples (the worst case,
since batches are length-bucketed longest first) with doubling, then bisection, catching out-of-memory errors;
the answer, less a safety margin for allocator fragmentation, goes into run.json under "batch", and a resumed
run on the same device and dtype reuses it without probing. On CPU there is nothing to probe against (memory
is host RAM and swap), so "auto" is a fixed default. An integer in the recipe is used as given.
"""
from __future__ import annotations

import gc
from typing import Any, Callable, Sequence

import torch

from headedit.errors import HeadeditError
from headedit.events import Log, Reporter, null_reporter
from headedit.model.heads import Head

CPU_BATCH = 16  # "auto" on CPU (and MPS): no probing
START = 8  # first probe
LIMIT = 1024  # never probe beyond this many examples per batch
SAFETY = 0.9  # keep this share of the largest batch that fit: room for fragmentation and longer drafts


class BatchSizeError(HeadeditError):
    """Not even one example fits on the device."""


def is_oom(err: BaseException) -> bool:
    """An out-of-memory failure (torch's own type, or the cuBLAS/cuDNN allocation errors it can surface as)."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in text or "ALLOC_FAILED" in text)


def _free(device: Any = None) -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def largest_that_fits(probe: Callable[[int], None], start: int = START, limit: int = LIMIT) -> tuple[int, list[int]]:
    """(largest n in 1..limit with probe(n) not raising out-of-memory, the sizes probed in order).

    Doubles from `start` until a probe fails (halving first when `start` itself fails), then bisects between
    the last size that fit and the first that did not. Other exceptions propagate: they are bugs, not memory.
    """
    tried: list[int] = []

    def fits(n: int) -> bool:
        tried.append(n)
        try:
            probe(n)
            return True
        except (torch.OutOfMemoryError, RuntimeError) as err:
            if not is_oom(err):
                raise
            _free()
            return False

    start = max(1, min(start, limit))
    ok, bad = 0, None
    n = start
    while not fits(n):
        bad = n
        if n == 1:
            raise BatchSizeError("not even one example of the longest length fits in device memory",
                                 "use a smaller dtype (bfloat16), shorter prompts, or model.max_memory over more GPUs")
        n = max(1, n // 2)
    ok = n
    while bad is None and ok < limit:
        n = min(ok * 2, limit)
        if fits(n):
            ok = n
        else:
            bad = n
    while bad is not None and bad - ok > 1:
        mid = (ok + bad) // 2
        if fits(mid):
            ok = mid
        else:
            bad = mid
    return ok, tried


def engine_probe(engine: Any, task: Any, examples: Sequence[Any], reserve_bytes: int | None = None) -> Callable[[int], None]:
    """probe(n): the real engine on the n longest examples (cycled when n exceeds the split), with as many packed sets per forward as it will use.

    The engine's ratio of rows per forward to examples per batch is kept (set packing stays as configured);
    the sets ablate layer 0 (full forwards) and a middle layer (so intact hidden states are captured). The
    prefix cache's byte budget is held as a dummy allocation during the probe, as it will be during the run.
    """
    ratio = max(1, engine.max_rows // max(1, engine.batch_size))
    layout = engine.layout
    heads = layout.attention_layers  # layers with heads (a hybrid's first layer may have none)
    sets: list[tuple[Head, ...]] = [(Head(heads[0].layer, h % heads[0].num_heads),) for h in range(ratio)]
    if len(heads) > 1:
        sets.append((Head(heads[len(heads) // 2].layer, 0),))
    lengths = sorted(range(len(examples)), key=lambda i: -len(engine.plan(task, examples[i])[0].tokens))
    reserve = engine.hidden.max_bytes if reserve_bytes is None else reserve_bytes

    def probe(n: int) -> None:
        chosen = [examples[lengths[i % len(lengths)]] for i in range(n)]  # the longest, repeated past the split
        engine.batch_size, engine.max_rows = n, n * ratio
        held = torch.empty(reserve, dtype=torch.uint8, device=engine.device) if reserve else None
        try:
            engine.correctness(task, chosen, sets)
            if engine.device.type == "cuda":
                torch.cuda.synchronize(engine.device)
        finally:
            del held
            engine.clear_caches()

    return probe


def device_key(engine: Any) -> str:
    """What a remembered batch size depends on: device model and memory, dtype."""
    dev = engine.device
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name = f"{props.name} {props.total_memory // 2**20} MiB"
    else:
        name = dev.type
    return f"{name} {str(engine.dtype).replace('torch.', '')}"


def resolve_batch(
    engine: Any,
    spec: int | str,
    task: Any,
    examples: Sequence[Any],
    run: Any = None,
    reporter: Reporter = null_reporter,
    probe: Callable[[int], None] | None = None,
    limit: int = LIMIT,
) -> dict[str, Any]:
    """Set `engine.batch_size` / `engine.max_rows` from the recipe's `model.batch_size`; returns the record.

    `probe` defaults to `engine_probe` on CUDA; passing one probes on any device (tests use a probe with a
    fixed memory budget). With a `run`, the record is read from and written to run.json's "batch".
    """
    ratio = max(1, engine.max_rows // max(1, engine.batch_size))
    if spec != "auto":
        record: dict[str, Any] = {"batch_size": int(spec), "source": "recipe"}
    elif probe is None and engine.device.type != "cuda":
        record = {"batch_size": CPU_BATCH, "source": f"default on {engine.device.type}"}
    else:
        key = device_key(engine)
        remembered = (getattr(run, "info", None) or {}).get("batch") if run is not None else None
        if isinstance(remembered, dict) and remembered.get("device") == key and remembered.get("source") == "probed":
            reporter(Log(f"batch size {remembered['batch_size']} (probed earlier, kept in run.json)"))
            record = dict(remembered)
        else:
            reporter(Log(f"probing the largest batch that fits on {key}"))
            fit, tried = largest_that_fits(probe or engine_probe(engine, task, examples), limit=limit)
            record = {"batch_size": max(1, int(fit * SAFETY)) if fit > 1 else 1, "largest_fit": fit,
                      "probes": tried, "device": key, "source": "probed"}
            reporter(Log(f"batch size {record['batch_size']} ({fit} fit; probed {tried})"))
    engine.batch_size = int(record["batch_size"])
    engine.max_rows = engine.batch_size * ratio
    engine.clear_caches()
    if run is not None and (getattr(run, "info", {}) or {}).get("batch") != record:
        run.update_info(batch=record)
    return record


__all__ = ["largest_that_fits", "engine_probe", "resolve_batch", "device_key", "is_oom", "BatchSizeError",
           "CPU_BATCH", "SAFETY"]
