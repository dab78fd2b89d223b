"""`headedit bench eval`: the engine vs the plain reference path (`headedit.engine.reference`), same model and
data, timed side by side, with identical per-example results required; achieved FLOP/s next to the plain
matmul peak of the same dtype, and optionally a second compute dtype (bfloat16 on CPU) compared.
"""
from __future__ import annotations

import random
import time
from typing import Any, Sequence

import numpy as np
import torch

from headedit.bench.flops import FlopCounter
from headedit.engine.core import Engine
from headedit.engine.reference import reference_correctness
from headedit.model.heads import Head, HeadLayout
from headedit.tasks.base import Example, Task

# ---- synthetic data so the bench runs anywhere ------------------------------------------------
_WORDS = ("the river city was built on a hill near old stone bridge where people trade grain and wool "
          "each spring market opens with music while children run along narrow streets").split()


def synthetic_boolq(n: int, seed: int = 0) -> list[Example]:
    """BoolQ-schema examples (passage, question, yes/no) made of common words; prompt format as the real task."""
    # lazy: loaded when a benchmark runs
    from headedit.tasks.boolq import BoolQTask

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        passage = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(30, 60))).capitalize() + "."
        question = "is " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 8)))
        rows.append(BoolQTask.example(i, {"passage": passage, "question": question, "answer": rng.random() < 0.6}))
    return rows


def synthetic_hellaswag(n: int, seed: int = 0) -> list[Example]:
    # lazy: loaded when a benchmark runs
    from headedit.tasks.hellaswag import HellaSwagTask

    rng = random.Random(seed)

    def sentence(a: int, b: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(a, b))) + "."

    return [
        HellaSwagTask.example(i, {"activity_label": "Walking", "ctx_a": sentence(15, 30), "ctx_b": "",
                                  "endings": [sentence(4, 12) for _ in range(4)], "label": str(rng.randint(0, 3))})
        for i in range(n)
    ]


def bench_examples(task: Task, n: int, data_dir: str | None) -> tuple[list[Example], str]:
    """Real rows when a data folder is known (or for generated arithmetic), else synthetic rows of the schema."""
    # lazy: loaded when a benchmark runs
    from headedit.tasks.data import data_dir_from

    if task.name == "arithmetic" or data_dir_from(data_dir) is not None:
        split = task.load("heldout", n, 0, data_dir_from(data_dir))
        return list(split.examples), split.source
    if task.name == "boolq":
        return synthetic_boolq(n), "synthetic boolq-schema rows"
    if task.name == "hellaswag":
        return synthetic_hellaswag(n), "synthetic hellaswag-schema rows"
    split = task.load("heldout", n, 0, None)
    return list(split.examples), split.source


def matmul_peak(hidden: int, inner: int, dtype: torch.dtype, rows: int = 1024, repeat: int = 5) -> float:
    """FLOP/s of a plain [rows, hidden] @ [hidden, inner] matmul in `dtype` on this CPU: the ceiling a forward at
    these shapes could approach (best of `repeat`)."""
    a = torch.randn(rows, hidden, dtype=dtype)
    b = torch.randn(hidden, inner, dtype=dtype)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * rows * hidden * inner / best


def _timed_engine(model: Any, tokenizer: Any, layout: HeadLayout, batch_size: int, task: Task,
                  examples: Sequence[Example], head_sets: list[tuple[Head, ...]]) -> tuple[np.ndarray, float, float]:
    """(correctness [sets, examples], seconds, executed FLOPs) of one engine pass."""
    engine = Engine(model, tokenizer, layout, batch_size=batch_size)
    counter = FlopCounter(model, layout)
    start = time.perf_counter()
    bits = engine.correctness(task, examples, head_sets)
    seconds = time.perf_counter() - start
    counter.close()
    return bits, seconds, counter.flops


def run_bench(task: Task, n: int = 32, sets: int = 4, batch_size: int = 16, data_dir: str | None = None,
              model: Any = None, tokenizer: Any = None, compare_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Time the engine and the reference on the same examples and head sets; compare per-example results.

    With `compare_dtype`, the engine also runs a copy of the model in that dtype (e.g. bfloat16) and the result
    says on how many (set, example) pairs its correctness differs from the model's own dtype.
    """
    # lazy: loaded when a benchmark runs
    from headedit.bench.tiny import tiny_model, tiny_tokenizer

    torch.manual_seed(0)
    tokenizer = tokenizer or tiny_tokenizer()
    model = model or tiny_model(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128)
    layout = HeadLayout.from_model(model)
    examples, source = bench_examples(task, n, data_dir)
    head_sets: list[tuple[Head, ...]] = [()]
    rng = random.Random(1)
    while len(head_sets) < sets:
        head_sets.append((Head(rng.randrange(layout.num_layers), rng.randrange(layout.num_heads)),))
    start = time.perf_counter()
    ref = np.stack([reference_correctness(model, tokenizer, layout, task, examples, hs) for hs in head_sets])
    t_ref = time.perf_counter() - start
    got, t_engine, flops = _timed_engine(model, tokenizer, layout, batch_size, task, examples, head_sets)
    dtype = next(model.parameters()).dtype
    shapes = (int(model.config.hidden_size), int(model.config.intermediate_size))
    result: dict[str, Any] = {
        "task": task.name, "examples": len(examples), "sets": len(head_sets), "source": source,
        "reference_s": t_ref, "engine_s": t_engine, "speedup": t_ref / max(t_engine, 1e-9),
        "identical": bool(np.array_equal(ref, got)), "accuracy": got.mean(axis=1).tolist(),
        "dtype": str(dtype).removeprefix("torch."), "engine_flops": flops,
        "engine_flop_s": flops / max(t_engine, 1e-9), "matmul_peak_flop_s": matmul_peak(*shapes, dtype),
    }
    if compare_dtype is not None and compare_dtype != dtype:
        import copy  # only this branch copies the model

        other_model = copy.deepcopy(model).to(compare_dtype)
        other_bits, t_other, flops = _timed_engine(other_model, tokenizer, layout, batch_size, task, examples,
                                                   head_sets)
        result["compare"] = {
            "dtype": str(compare_dtype).removeprefix("torch."), "engine_s": t_other,
            "engine_flop_s": flops / max(t_other, 1e-9), "matmul_peak_flop_s": matmul_peak(*shapes, compare_dtype),
            "differing": int((other_bits != got).sum()), "pairs": int(got.size),
            "accuracy": other_bits.mean(axis=1).tolist(),
        }
    return result
