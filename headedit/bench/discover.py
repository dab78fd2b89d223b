"""`headedit bench discover`: the full single screen plus joint search, three ways, same model and data.

(a) naive: the plain reference evaluation path (`headedit.engine.reference`: generate per example,
    one forward per choice) for every set, no hidden-state reuse, no early stop;
(b) plain batched: the engine with one teacher-forced forward per set (no prefix reuse, no set packing),
    no early stop, no pruning;
(c) fast: the engine with set packing, prefix reuse (intact states and shared search nodes, the first layer's
    attention from its cached o_proj input, the last layer's MLP only where logits are read) on batches cut
    at the looks (chunk, 2*chunk, ...) so every call reuses them, the screen's sequential early stop and the
    search's exact pruning (selection unchanged by construction).
All three must select the same heads; the last line reads `speedup: <a/c>x identical: yes|no`.
The journals live in a temporary folder with `synchronous=NORMAL` (same for all three paths): the benchmark
times evaluation, not fsync.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from headedit.discovery.early_stop import EarlyStop
from headedit.discovery.scorer import Scorer
from headedit.discovery.search import SearchSpec, joint_search
from headedit.discovery.single import single_screen
from headedit.journal import Journal
from headedit.model.heads import Head, HeadLayout, format_heads
from headedit.tasks.base import Example, Task


def _discover(eval_fn: Any, n: int, layout: HeadLayout, spec: SearchSpec, k: int, early_stop: EarlyStop | None,
              folder: Path, name: str) -> tuple[str, float, dict[str, Any]]:
    with Journal(folder / f"{name}.sqlite") as journal:
        journal.db.execute("PRAGMA synchronous=NORMAL")
        scorer = Scorer(journal, "discovery", n, eval_fn, sets_per_call=16)
        start, cpu = time.perf_counter(), time.process_time()
        screen = single_screen(scorer, layout, early_stop)
        screen_seconds = time.perf_counter() - start
        result = joint_search(scorer, screen.top(k), layout.all_heads(), spec)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
    info = {"screen_seconds": screen_seconds, "cpu_seconds": cpu, "sets": scorer.sets_evaluated, "head_examples": scorer.examples_evaluated,
            "early_stopped": screen.extra.get("early_stopped", 0), "acc": result.selected_acc,
            "pruned": sum(1 for t in result.trace if t.get("pruned")), "search_sets": len(result.trace),
            "intact": result.intact_acc}
    return format_heads(result.selected), elapsed, info


def run_bench(model: Any, tokenizer: Any, task: Task, examples: Sequence[Example], k: int = 6, max_heads: int = 3,
              beam: int = 2, batch_size: int = 32, alpha: float = 0.01, skip: Sequence[str] = (),
              repeat: int = 3) -> dict[str, Any]:
    """Times (a), (b), (c) (minus `skip`, for profiling) on the same model and examples; see the module docstring.

    (b) and (c) take well under a second on the demo, so each runs `repeat` times from cold (fresh engine and
    journal) and reports the fastest, as timeit does; (a) runs once. Every repeat must select the same heads.
    """
    # lazy: loaded when a benchmark runs
    from headedit.engine.core import Engine
    from headedit.engine.reference import reference_correctness

    layout = HeadLayout.from_model(model)
    examples = list(examples)
    n = len(examples)
    plain_spec = SearchSpec(method="greedy", beam=beam, max_heads=max_heads, min_gain=0.0, prune=False)
    chunk = batch_size * max(1, -(-n // (16 * batch_size)))  # ~n/16, a multiple of the batch
    fast_spec = SearchSpec(method="greedy", beam=beam, max_heads=max_heads, min_gain=0.0, prune=True,
                           prune_chunk=chunk)  # same looks as the early stop: chunk, 2*chunk, ... (aligned caches)
    stop = EarlyStop(chunk=chunk, alpha=alpha, min_n=chunk)

    def naive(sets: list[tuple[Head, ...]], a: int, b: int) -> np.ndarray:
        rows = [reference_correctness(model, tokenizer, layout, task, examples[a:b], hs) for hs in sets]
        return np.stack(rows).reshape(len(sets), b - a)

    def batched() -> Any:  # a fresh engine per timing: no cache carries over between repeats
        engine = Engine(model, tokenizer, layout, batch_size=batch_size, prefix_reuse=False, max_rows=batch_size)
        return lambda sets, a, b: engine.correctness(task, examples[a:b], sets)

    def fast() -> Any:
        engine = Engine(model, tokenizer, layout, batch_size=batch_size * 4, max_rows=batch_size * 16)
        return engine.range_eval(task, examples, block=chunk, doubling=True)

    paths = (
        ("naive", lambda: naive, None, plain_spec, 1),  # minutes: timed once
        ("batched", batched, None, plain_spec, repeat),
        ("fast", fast, stop, fast_spec, repeat),
    )
    out: dict[str, Any] = {"task": task.name, "n": n, "heads": layout.total_heads, "k": k, "max_heads": max_heads,
                           "beam": beam, "threads": torch.get_num_threads(), "early_stop": stop.rule(),
                           "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="headedit-bench-") as tmp:
        for name, make, es, spec, times in paths:
            if name in skip:
                continue
            runs = [_discover(make(), n, layout, spec, k, es, Path(tmp), f"{name}-{i}") for i in range(max(1, times))]
            selected, seconds, info = min(runs, key=lambda r: r[1])  # best of `times`, as timeit reports
            out[name] = {"selected": selected, "seconds": seconds, **info,
                         "all_seconds": [r[1] for r in runs], "all_selected": sorted({r[0] for r in runs})}
    ran = [name for name, *_ in paths if name in out]
    out["identical"] = len({sel for name in ran for sel in out[name]["all_selected"]}) == 1
    for ref, key in (("naive", "speedup_vs_naive"), ("batched", "speedup_vs_batched")):
        if ref in out and "fast" in out:
            out[key] = out[ref]["seconds"] / max(out["fast"]["seconds"], 1e-9)
    return out


def model_and_task(model_id: str | None, task_name: str | None, n: int) -> tuple[Any, Any, Task, list, str]:
    # lazy: loaded when a benchmark runs
    from headedit.bench.eval import bench_examples
    from headedit.model.loading import load_model, resolve_model
    from headedit.tasks import get_task

    if model_id is None:
        try:
            resolve_model("headedit:demo")
            model_id = "headedit:demo"
        except Exception:
            model_id = None
    if model_id is not None:
        model, tokenizer, _ = load_model(model_id, dtype="float32", device="cpu")
        task = get_task(task_name or ("copy-first" if model_id == "headedit:demo" else "boolq"))
        examples = list(task.load("discovery", n, 0, None).examples)
        return model, tokenizer, task, examples, f"{model_id}, {task.name} discovery split"
    # lazy: loaded when a benchmark runs
    from headedit.bench.tiny import tiny_model, tiny_tokenizer

    model = tiny_model(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128)
    task = get_task(task_name or "boolq")
    examples, source = bench_examples(task, n, None)
    return model, tiny_tokenizer(), task, examples, f"tiny random Llama, {source}"
