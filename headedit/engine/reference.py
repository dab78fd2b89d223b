"""The plain reference path of every task kind: what a user would write, which the fast engine must match.

One unbatched greedy `generate` per example for exact match (correct when the greedy tokens are the target
tokens: lm-eval's `is_greedy`) and for generated tasks; one unbatched forward per choice for multiple choice.
Tests and benchmarks compare the engine's per-example results with these, exactly.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from headedit.engine.batch import plan_example, stop_token_id
from headedit.engine.generate import finish_text, greedy_generate
from headedit.model.ablation import ablate
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


__all__ = ["reference_correctness"]
