"""Generated tasks under ablation, from the intact model's greedy drafts.

The intact greedy output (the draft) is generated once per example and cached. To score an ablation set, the
prompt plus draft is teacher-forced in one batched forward: where every draft token is the ablated model's
argmax, its greedy output is the draft itself (same tokens, so the same stop), and the intact verdict holds.
Rows that diverge at draft position j continue with real greedy generation from prompt + draft[:j], so the
divergent token and every stop criterion come from `generate` itself, exactly as in the plain path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from .ablation import ablate
from .engine_batch import Plan
from .heads import Head
from .tasks.base import Example, Task

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True)
class Draft:
    context: tuple[int, ...]
    tokens: tuple[int, ...]  # generated ids, including the EOS or stop-completing token
    text: str  # decoded and cut at the first stop sequence
    correct: bool


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


@torch.no_grad()
def greedy_generate(model: Any, tokenizer: Any, ids: Sequence[int], max_new: int, stop: Sequence[str]) -> list[int]:
    """Plain unbatched greedy `generate`: the reference path, and the continuation of diverging rows."""
    if max_new <= 0:
        return []
    device = next(model.parameters()).device
    inputs = torch.tensor([list(ids)], dtype=torch.long, device=device)  # [1, pos]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids(model, tokenizer) or [0])[0]
    kwargs: dict[str, Any] = dict(
        input_ids=inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new, do_sample=False,
        eos_token_id=eos_ids(model, tokenizer) or None, pad_token_id=pad, temperature=None, top_p=None, top_k=None,
    )
    if stop:
        kwargs.update(stop_strings=list(stop), tokenizer=tokenizer)
    out = model.generate(**kwargs)
    return out[0, inputs.shape[1]:].tolist()


def finish_text(tokenizer: Any, tokens: Sequence[int], stop: Sequence[str]) -> str:
    """Decoded continuation cut before the first stop sequence (lm-eval's `until`)."""
    text = tokenizer.decode(list(tokens), skip_special_tokens=True)
    for s in stop:
        if s:
            text = text.split(s)[0]
    return text


def context_ids(engine: "Engine", task: Task, example: Example) -> tuple[int, ...]:
    return engine.plan(task, example)[0].tokens


def get_draft(engine: "Engine", task: Task, example: Example) -> Draft:
    """The intact model's greedy output for one example (cached on the engine)."""
    ctx = context_ids(engine, task, example)
    key = (task.name, ctx, task.max_new_tokens, tuple(task.stop))
    hit = engine._drafts.get(key)
    if hit is None:
        tokens = greedy_generate(engine.model, engine.tokenizer, ctx, task.max_new_tokens, task.stop)
        text = finish_text(engine.tokenizer, tokens, task.stop)
        hit = Draft(ctx, tuple(tokens), text, bool(task.check(example, text)))
        engine._drafts[key] = hit
    return hit


def _draft_plan(draft: Draft) -> Plan:
    n = len(draft.context)
    gathers = tuple((n - 1 + j, tok, 0) for j, tok in enumerate(draft.tokens))
    return Plan(draft.context + draft.tokens, gathers, context_len=n)


def draft_plans(engine: "Engine", task: Task, examples: list[Example]) -> tuple[list[Plan], list[int]]:
    """Teacher-forcing plans of the intact drafts the intact model gets right (for answer log-probabilities)."""
    plans, keep = [], []
    for i, ex in enumerate(examples):
        d = get_draft(engine, task, ex)
        if d.correct and d.tokens:
            plans.append(_draft_plan(d))
            keep.append(i)
    return plans, keep


def generate_correctness(engine: "Engine", task: Task, examples: list[Example], sets: list[tuple[Head, ...]]) -> np.ndarray:
    out = np.zeros((len(sets), len(examples)), dtype=bool)
    drafts = [get_draft(engine, task, ex) for ex in examples]
    ablated = [s for s, hs in enumerate(sets) if hs]
    for s, hs in enumerate(sets):
        if not hs:
            out[s] = [d.correct for d in drafts]
    with_tokens = [i for i, d in enumerate(drafts) if d.tokens]
    for i, d in enumerate(drafts):
        if not d.tokens:  # nothing generated intact: teacher forcing has nothing to check, generate for real
            for s in ablated:
                with ablate(engine.model, engine.layout, heads=sets[s]):
                    more = greedy_generate(engine.model, engine.tokenizer, d.context, task.max_new_tokens, task.stop)
                out[s, i] = bool(task.check(examples[i], finish_text(engine.tokenizer, more, task.stop)))
    if not ablated or not with_tokens:
        return out
    plans = [_draft_plan(drafts[i]) for i in with_tokens]
    raw = engine.score_plans(plans, [sets[s] for s in ablated])
    for s, per_batch in zip(ablated, raw):
        diverge: dict[int, int] = {}  # plan index -> first draft position whose argmax differs
        for batch, sc in per_batch:
            seen: dict[int, int] = {}
            for i, member in enumerate(batch.gather_member):
                j = seen.get(member, 0)
                seen[member] = j + 1
                if member not in diverge and sc.argmax[i] != batch.gather_tok[i].item():
                    diverge[member] = j
        for p, ex_i in enumerate(with_tokens):
            d = drafts[ex_i]
            if p not in diverge:
                out[s, ex_i] = d.correct
                continue
            j = diverge[p]
            with ablate(engine.model, engine.layout, heads=sets[s]):
                more = greedy_generate(
                    engine.model, engine.tokenizer, d.context + d.tokens[:j], task.max_new_tokens - j, task.stop
                )
            text = finish_text(engine.tokenizer, list(d.tokens[:j]) + more, task.stop)
            out[s, ex_i] = bool(task.check(examples[ex_i], text))
    return out
