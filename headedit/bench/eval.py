"""The plain reference path of every task kind, and `headedit bench eval`: engine vs reference, same model/data.

Reference = what a user would write: one unbatched `generate` per example for exact match (correct when the
greedy tokens are the target tokens: lm-eval's `is_greedy`) and for generated tasks, one unbatched forward per
choice for multiple choice. The engine must give identical per-example results.
"""
from __future__ import annotations

import random
import time
from typing import Any, Sequence

import numpy as np
import torch

from headedit.model.ablation import ablate
from headedit.engine.core import Engine
from headedit.engine.batch import plan_example, stop_token_id
from headedit.engine.generate import finish_text, greedy_generate
from headedit.model.heads import Head, HeadLayout
from headedit.tasks.base import Example, Task


@torch.no_grad()
def reference_correctness(
    model: Any, tokenizer: Any, layout: HeadLayout, task: Task, examples: Sequence[Example],
    heads: Sequence[Head] = (), chat: bool = False, chat_template_kwargs: dict | None = None,
) -> np.ndarray:
    """bool [len(examples)] by the plain path, under `heads` zero-ablated."""
    stop_id = stop_token_id(model, tokenizer)
    device = next(model.parameters()).device
    out = np.zeros(len(examples), dtype=bool)
    with ablate(model, layout, heads=heads):
        for i, ex in enumerate(examples):
            plan, conts = plan_example(task, ex, tokenizer, chat, chat_template_kwargs, stop_id)
            ctx = list(plan.tokens[: plan.context_len])
            if task.kind == "exact":
                target = list(conts[0])
                out[i] = greedy_generate(model, tokenizer, ctx, len(target), ()) == target
            elif task.kind == "generate":
                tokens = greedy_generate(model, tokenizer, ctx, task.max_new_tokens, task.stop)
                out[i] = bool(task.check(ex, finish_text(tokenizer, tokens, task.stop)))
            else:
                scores = []
                for cont in conts:
                    ids = torch.tensor([ctx + list(cont)], device=device)  # [1, pos]
                    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # [pos, vocab]
                    at = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(cont), device=device)
                    scores.append(float(logp[at, torch.tensor(cont, device=device)].double().sum()))
                if task.length_normalize:
                    lengths = ex.meta.get("choice_lengths") or [len(c.encode("utf-8")) for c in ex.choices]
                    scores = [s / max(1, n) for s, n in zip(scores, lengths)]
                out[i] = int(np.argmax(scores)) == ex.label
    return out


# ---- synthetic data so the bench runs anywhere ------------------------------------------------
_WORDS = ("the river city was built on a hill near old stone bridge where people trade grain and wool "
          "each spring market opens with music while children run along narrow streets").split()


def synthetic_boolq(n: int, seed: int = 0) -> list[Example]:
    """BoolQ-schema examples (passage, question, yes/no) made of common words; prompt format as the real task."""
    from headedit.tasks.boolq import BoolQTask

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        passage = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(30, 60))).capitalize() + "."
        question = "is " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 8)))
        rows.append(BoolQTask.example(i, {"passage": passage, "question": question, "answer": rng.random() < 0.6}))
    return rows


def synthetic_hellaswag(n: int, seed: int = 0) -> list[Example]:
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


def run_bench(task: Task, n: int = 32, sets: int = 4, batch_size: int = 16, data_dir: str | None = None,
              model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Time the engine and the reference on the same examples and head sets; compare per-example results."""
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
    engine = Engine(model, tokenizer, layout, batch_size=batch_size)
    start = time.perf_counter()
    got = engine.correctness(task, examples, head_sets)
    t_engine = time.perf_counter() - start
    return {
        "task": task.name, "examples": len(examples), "sets": len(head_sets), "source": source,
        "reference_s": t_ref, "engine_s": t_engine, "speedup": t_ref / max(t_engine, 1e-9),
        "identical": bool(np.array_equal(ref, got)), "accuracy": got.mean(axis=1).tolist(),
    }
