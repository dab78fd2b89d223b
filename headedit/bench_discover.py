"""`headedit bench discover`: the full single screen plus joint search, three ways, same model and data.

(a) naive: the plain reference evaluation path (`bench_eval.reference_correctness`: generate per example,
    one forward per choice) for every set, no hidden-state reuse, no early stop;
(b) plain batched: the engine with one teacher-forced forward per set (no prefix reuse, no set packing),
    no early stop;
(c) fast: the engine with set packing and prefix reuse, plus the screen's sequential early stop.
All three must select the same heads; the last line reads `speedup: <a/c>x identical: yes|no`.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .discovery.early_stop import EarlyStop
from .discovery.scorer import Scorer
from .discovery.search import SearchSpec, joint_search
from .discovery.single import single_screen
from .heads import Head, HeadLayout, format_heads
from .runs import Journal
from .tasks.base import Example, Task


def _discover(eval_fn: Any, n: int, layout: HeadLayout, spec: SearchSpec, k: int, early_stop: EarlyStop | None,
              folder: Path, name: str) -> tuple[str, float, dict[str, Any]]:
    with Journal(folder / f"{name}.sqlite") as journal:
        scorer = Scorer(journal, "discovery", n, eval_fn, sets_per_call=16)
        start = time.perf_counter()
        screen = single_screen(scorer, layout, early_stop)
        result = joint_search(scorer, screen.top(k), layout.all_heads(), spec)
        elapsed = time.perf_counter() - start
    info = {"sets": scorer.sets_evaluated, "head_examples": scorer.examples_evaluated,
            "early_stopped": screen.extra.get("early_stopped", 0), "acc": result.selected_acc,
            "intact": result.intact_acc}
    return format_heads(result.selected), elapsed, info


def run_bench(model: Any, tokenizer: Any, task: Task, examples: Sequence[Example], k: int = 6, max_heads: int = 3,
              beam: int = 2, batch_size: int = 32, alpha: float = 0.01) -> dict[str, Any]:
    from .bench_eval import reference_correctness
    from .engine import Engine

    layout = HeadLayout.from_model(model)
    examples = list(examples)
    n = len(examples)
    spec = SearchSpec(method="greedy", beam=beam, max_heads=max_heads, min_gain=0.0)
    chunk = max(16, -(-n // 16))
    stop = EarlyStop(chunk=chunk, alpha=alpha, min_n=chunk)

    def naive(sets: list[tuple[Head, ...]], a: int, b: int) -> np.ndarray:
        rows = [reference_correctness(model, tokenizer, layout, task, examples[a:b], hs) for hs in sets]
        return np.stack(rows).reshape(len(sets), b - a)

    plain_engine = Engine(model, tokenizer, layout, batch_size=batch_size, prefix_reuse=False, max_rows=batch_size)
    fast_engine = Engine(model, tokenizer, layout, batch_size=batch_size, max_rows=batch_size * 8)
    paths = (
        ("naive", naive, None),
        ("batched", lambda sets, a, b: plain_engine.correctness(task, examples[a:b], sets), None),
        ("fast", lambda sets, a, b: fast_engine.correctness(task, examples[a:b], sets), stop),
    )
    out: dict[str, Any] = {"task": task.name, "n": n, "heads": layout.total_heads, "k": k, "max_heads": max_heads,
                           "beam": beam, "threads": torch.get_num_threads(), "early_stop": stop.rule()}
    with tempfile.TemporaryDirectory(prefix="headedit-bench-") as tmp:
        for name, fn, es in paths:
            selected, seconds, info = _discover(fn, n, layout, spec, k, es, Path(tmp), name)
            out[name] = {"selected": selected, "seconds": seconds, **info}
    out["identical"] = out["naive"]["selected"] == out["batched"]["selected"] == out["fast"]["selected"]
    out["speedup_vs_naive"] = out["naive"]["seconds"] / max(out["fast"]["seconds"], 1e-9)
    out["speedup_vs_batched"] = out["batched"]["seconds"] / max(out["fast"]["seconds"], 1e-9)
    return out


def _model_and_task(model_id: str | None, task_name: str | None, n: int) -> tuple[Any, Any, Task, list, str]:
    from .bench_eval import bench_examples
    from .loading import load_model, resolve_model
    from .tasks import get_task

    if model_id is None:
        try:
            resolve_model("headedit:demo")
            model_id = "headedit:demo"
        except Exception:
            model_id = None
    if model_id is not None:
        model, tokenizer, _ = load_model(model_id, dtype="float32", device="cpu")
        task = get_task(task_name or ("copy-second" if model_id == "headedit:demo" else "boolq"))
        examples = list(task.load("discovery", n, 0, None).examples)
        return model, tokenizer, task, examples, f"{model_id}, {task.name} discovery split"
    from .tiny import tiny_model, tiny_tokenizer

    model = tiny_model(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128)
    task = get_task(task_name or "boolq")
    examples, source = bench_examples(task, n, None)
    return model, tiny_tokenizer(), task, examples, f"tiny random Llama, {source}"


def add_bench_parser(sub: Any) -> None:
    """Registers `headedit bench discover` (found by `headedit.commands.bench`)."""
    p = sub.add_parser("discover", help="single screen + search: naive vs plain batched vs fast path, same selection")
    p.add_argument("--model", default=None, help="model folder or id (default: the bundled demo, else a tiny Llama)")
    p.add_argument("--task", default=None, help="task (default copy-second for the demo, boolq otherwise)")
    p.add_argument("--n", type=int, default=96, help="discovery examples (default 96)")
    p.add_argument("--candidates", type=int, default=6)
    p.add_argument("--max-heads", type=int, default=3)
    p.add_argument("--beam", type=int, default=2)
    p.set_defaults(bench_func=_cli)


def _cli(args: argparse.Namespace, console: Any) -> int:
    from .errors import HeadeditError

    if args.n < 1 or args.candidates < 1 or args.max_heads < 1 or args.beam < 1:
        raise HeadeditError("--n, --candidates, --max-heads and --beam must be at least 1", "e.g. --n 96")
    model, tokenizer, task, examples, source = _model_and_task(args.model, args.task, args.n)
    r = run_bench(model, tokenizer, task, examples, args.candidates, args.max_heads, args.beam)
    console.print(f"{source}: {r['n']} examples, {r['heads']} heads, top-{r['k']} candidates, beam {r['beam']}, "
                  f"max {r['max_heads']} heads, threads {r['threads']}", soft_wrap=True, highlight=False)
    for name, label in (("naive", "(a) naive reference loop"), ("batched", "(b) plain batched loop"),
                        ("fast", "(c) fast path")):
        p = r[name]
        console.print(f"{label}: {p['seconds']:.2f} s, {p['sets']} set evaluations, {p['head_examples']} "
                      f"set-examples, selected {p['selected'] or '(none)'}", soft_wrap=True, highlight=False)
    console.print(f"a/c: {r['speedup_vs_naive']:.1f}x   b/c: {r['speedup_vs_batched']:.1f}x", highlight=False)
    console.print(f"speedup: {r['speedup_vs_naive']:.1f}x identical: {'yes' if r['identical'] else 'no'}",
                  soft_wrap=True, highlight=False)
    return 0 if r["identical"] else 1
