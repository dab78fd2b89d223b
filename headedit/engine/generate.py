"""Generated tasks under ablation, from the intact model's greedy drafts.

The intact greedy output (the draft) is generated once per example and cached. To score an ablation set, the
prompt plus draft is teacher-forced in one batched forward: where every draft token is the ablated model's
argmax, its greedy output is the draft itself (same tokens, so the same stop), and the intact verdict holds.
Rows that diverge at draft position j continue with real greedy generation from prompt + draft[:j], so the
divergent token and every stop criterion come from `generate` itself, exactly as in the plain path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np
import torch

from headedit.engine.batch import Plan
from headedit.model.ablation import ablate
from headedit.model.heads import Head
from headedit.tasks.base import Example, Task

if TYPE_CHECKING:
    from headedit.engine.core import Engine


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
    return get_drafts(engine, task, [example])[0]


def _draft_plan(draft: Draft) -> Plan:
    n = len(draft.context)
    gathers = tuple((n - 1 + j, tok, 0) for j, tok in enumerate(draft.tokens))
    return Plan(draft.context + draft.tokens, gathers, context_len=n)


def draft_plans(engine: "Engine", task: Task, examples: list[Example]) -> tuple[list[Plan], list[int]]:
    """Teacher-forcing plans of the intact drafts the intact model gets right (for answer log-probabilities)."""
    plans, keep = [], []
    for i, d in enumerate(get_drafts(engine, task, examples)):
        if d.correct and d.tokens:
            plans.append(_draft_plan(d))
            keep.append(i)
    return plans, keep


def check_texts(task: Task, examples: Sequence[Example], texts: Sequence[str]) -> list[bool]:
    """Verdicts of many generated texts: one `check_many` call when the task has it (MBPP runs programs in
    parallel and once per distinct program), else `check` per row."""
    if not texts:
        return []
    many = getattr(task, "check_many", None)
    if callable(many):
        return [bool(v) for v in many(list(examples), list(texts))]
    return [bool(task.check(ex, t)) for ex, t in zip(examples, texts)]


def get_drafts(engine: "Engine", task: Task, examples: list[Example]) -> list[Draft]:
    """Intact drafts of many examples; the new ones are checked in one `check_texts` call."""
    missing: dict[tuple, tuple[int, tuple[int, ...], tuple[int, ...], str]] = {}
    keys = []
    for i, ex in enumerate(examples):
        ctx = context_ids(engine, task, ex)
        key = (task.name, ctx, task.max_new_tokens, tuple(task.stop))
        keys.append(key)
        if key not in engine._drafts and key not in missing:
            tokens = greedy_generate(engine.model, engine.tokenizer, ctx, task.max_new_tokens, task.stop)
            missing[key] = (i, ctx, tuple(tokens), finish_text(engine.tokenizer, tokens, task.stop))
    if missing:
        rows = list(missing.items())
        verdicts = check_texts(task, [examples[i] for _, (i, _, _, _) in rows], [t for _, (_, _, _, t) in rows])
        for (key, (_, ctx, draft_tokens, text)), ok in zip(rows, verdicts):
            engine._drafts[key] = Draft(ctx, draft_tokens, text, ok)
    return [engine._drafts[k] for k in keys]


def generate_correctness(engine: "Engine", task: Task, examples: list[Example], sets: list[tuple[Head, ...]]) -> np.ndarray:
    out = np.zeros((len(sets), len(examples)), dtype=bool)
    drafts = get_drafts(engine, task, examples)
    ablated = [s for s, hs in enumerate(sets) if hs]
    for s, hs in enumerate(sets):
        if not hs:
            out[s] = [d.correct for d in drafts]
    pending: list[tuple[int, int, str]] = []  # (set, example, ablated greedy text) still to check
    with_tokens = [i for i, d in enumerate(drafts) if d.tokens]
    for i, d in enumerate(drafts):
        if not d.tokens:  # nothing generated intact: teacher forcing has nothing to check, generate for real
            for s in ablated:
                with ablate(engine.model, engine.layout, heads=sets[s]):
                    more = greedy_generate(engine.model, engine.tokenizer, d.context, task.max_new_tokens, task.stop)
                pending.append((s, i, finish_text(engine.tokenizer, more, task.stop)))
    if ablated and with_tokens:
        plans = [_draft_plan(drafts[i]) for i in with_tokens]
        raw = engine.score_plans(plans, [sets[s] for s in ablated])
        for s, per_batch in zip(ablated, raw):
            diverge: dict[int, int] = {}  # plan index -> first draft position whose argmax differs
            for batch, sc in per_batch:
                wrong = cast(np.ndarray, sc.argmax != batch.gather_tok_host)  # [n_gathers] bool
                seen: dict[int, int] = {}
                for i, member in enumerate(batch.gather_member):  # gathers of a member are in draft order
                    j = seen.get(member, 0)
                    seen[member] = j + 1
                    if wrong[i] and member not in diverge:
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
                pending.append((s, ex_i, finish_text(engine.tokenizer, list(d.tokens[:j]) + more, task.stop)))
    verdicts = check_texts(task, [examples[i] for _, i, _ in pending], [t for _, _, t in pending])
    for (s, i, _), ok in zip(pending, verdicts):
        out[s, i] = ok
    return out
