"""Tokenization, scoring plans and padded batches for the engine.

A *plan* is one packed sequence per example plus the (position, target token) pairs whose log-probability and
argmax decide the example. Multi-token endings are packed after their shared context in ONE sequence
(`[context | ending 1 | ending 2 | ...]`) with segment ids: a token attends to the context and to earlier tokens
of its own ending only, and each ending's positions restart where the context ends. So the context is computed
once per example, and every ending sees exactly what it would see alone.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch

from headedit.model.ablation import to_device
from headedit.tasks.base import Example, Task


@dataclass(frozen=True)
class Plan:
    tokens: tuple[int, ...]
    gathers: tuple[tuple[int, int, int], ...]  # (position whose logits predict, target token, group)
    positions: tuple[int, ...] | None = None  # rotary positions; None = 0..n-1
    segments: tuple[int, ...] | None = None  # 0 = shared context, k+1 = ending k; None = plain causal
    context_len: int = 0


def format_prompt(tokenizer: Any, prompt: str, chat: bool, chat_template_kwargs: dict | None) -> tuple[str, bool]:
    """The text the model sees, and whether the tokenizer should add special tokens (not for chat text)."""
    if not chat:
        return prompt, True
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )
    return text, False


def split_pair(context: str, continuation: str) -> tuple[str, str]:
    """lm-eval's split: trailing context spaces move to the continuation."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


def encode_pair(tokenizer: Any, context: str, continuation: str, add_special: bool) -> tuple[list[int], list[int]]:
    """lm-eval's split: trailing context spaces move to the continuation; the continuation is whole[len(ctx):]."""
    context, continuation = split_pair(context, continuation)
    ctx = tokenizer(context, add_special_tokens=add_special)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=add_special)["input_ids"]
    if whole[: len(ctx)] == ctx and len(whole) > len(ctx):
        return list(ctx), list(whole[len(ctx):])
    return list(ctx), list(tokenizer(continuation, add_special_tokens=False)["input_ids"])


class PrefilledTokenizer:
    """A tokenizer whose single-string calls are answered from one batched encode (same ids: fast tokenizers
    encode each string of a batch on its own); anything else goes to the real tokenizer."""

    def __init__(self, tokenizer: Any, texts: dict[bool, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.ids: dict[tuple[str, bool], list[int]] = {}
        for special, group in texts.items():
            unique = list(dict.fromkeys(group))
            if unique:
                for text, ids in zip(unique, tokenizer(unique, add_special_tokens=special)["input_ids"]):
                    self.ids[(text, special)] = list(ids)

    def __call__(self, text: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        hit = self.ids.get((text, add_special_tokens)) if isinstance(text, str) and not kwargs else None
        if hit is not None:
            return {"input_ids": list(hit)}
        return self.tokenizer(text, add_special_tokens=add_special_tokens, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def texts_to_encode(task: Task, example: Example, tokenizer: Any, chat: bool, chat_kwargs: dict | None) -> dict[bool, list[str]]:
    """The strings `plan_example` will tokenize for one example, by add_special_tokens flag (for prefilling)."""
    text, special = format_prompt(tokenizer, example.prompt, chat, chat_kwargs)
    out: dict[bool, list[str]] = {special: [], False: []}
    if task.kind == "exact":
        conts = [exact_target(example, chat)]
    elif task.kind == "choice":
        conts = list(example.choices)
        out[False].extend(example.choices)
    else:
        return {special: [text]}
    for cont in conts:
        ctx, rest = split_pair(text, cont)
        out[special].extend([ctx, ctx + rest])
    return out


def stop_token_id(model: Any, tokenizer: Any) -> int | None:
    """The end-of-turn token a chat answer must end with (generation_config's first EOS, else the tokenizer's)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return eos if eos is not None else tokenizer.eos_token_id


def answer_stop_id(tokenizer: Any, token: str) -> int:
    """Id of a task's stop token, which must be one token of the vocabulary (else the task cannot be scored)."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(tid, int) or tid == tokenizer.unk_token_id and token != tokenizer.unk_token:
        raise ValueError(f"stop token {token!r} is not a single token of this tokenizer")
    return tid


def exact_target(example: Example, chat: bool) -> str:
    target = example.target or ""
    return target.lstrip() if chat else target


def plan_example(
    task: Task, example: Example, tokenizer: Any, chat: bool, chat_kwargs: dict | None, stop_id: int | None
) -> tuple[Plan, tuple[tuple[int, ...], ...]]:
    """The scoring plan of one example, and its continuations' token ids (for reference paths and byte counts)."""
    text, special = format_prompt(tokenizer, example.prompt, chat, chat_kwargs)
    if task.kind == "exact":
        ctx, cont = encode_pair(tokenizer, text, exact_target(example, chat), special)
        if chat and stop_id is not None:
            cont = cont + [stop_id]
        elif example.meta.get("stop_token"):  # the task's own answer terminator (the demo's `<eos>`)
            cont = cont + [answer_stop_id(tokenizer, example.meta["stop_token"])]
        tokens = tuple(ctx + cont)
        gathers = tuple((len(ctx) - 1 + j, tok, 0) for j, tok in enumerate(cont))
        return Plan(tokens, gathers, context_len=len(ctx)), (tuple(cont),)
    if task.kind == "choice":
        pairs = [encode_pair(tokenizer, text, choice, special) for choice in example.choices]
        ctx = pairs[0][0]
        conts: list[list[int]] = [cont for _, cont in pairs]
        if any(c != ctx for c, _ in pairs):  # context tokenized differently per choice: fall back to separate encoding
            conts = [tokenizer(ch, add_special_tokens=False)["input_ids"] for ch in example.choices]
        if all(len(c) == 1 for c in conts):
            gathers = tuple((len(ctx) - 1, c[0], k) for k, c in enumerate(conts))
            return Plan(tuple(ctx), gathers, context_len=len(ctx)), tuple(tuple(c) for c in conts)
        seq, positions, segments = list(ctx), list(range(len(ctx))), [0] * len(ctx)
        gathered: list[tuple[int, int, int]] = []
        for k, cont in enumerate(conts):
            start = len(seq)
            for j, tok in enumerate(cont):
                gathered.append((len(ctx) - 1 if j == 0 else start + j - 1, tok, k))
            seq += cont
            positions += range(len(ctx), len(ctx) + len(cont))
            segments += [k + 1] * len(cont)
        return (
            Plan(tuple(seq), tuple(gathered), tuple(positions), tuple(segments), context_len=len(ctx)),
            tuple(tuple(c) for c in conts),
        )
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    return Plan(tuple(ids), (), context_len=len(ids)), ()


@dataclass
class Batch:
    """Padded tensors of some plans (right padding: real tokens keep positions 0..n-1, as unpadded)."""

    key: tuple  # identity of the batch content, for caches
    members: list[int]  # indices into the caller's plan list
    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos] ints, or [batch, 1, pos, pos] additive float for packed endings
    position_ids: torch.Tensor | None  # [batch, pos] or None
    gather_row: torch.Tensor  # [n_gathers]
    gather_pos: torch.Tensor  # [n_gathers]
    gather_tok: torch.Tensor  # [n_gathers]
    gather_member: list[int]  # [n_gathers] which member (row) each gather belongs to
    gather_group: list[int]  # [n_gathers]
    gather_tok_host: np.ndarray | None = None  # [n_gathers] the same tokens on the host (no sync to read them)

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])


def make_batches(plans: Sequence[Plan], batch_size: int, pad_id: int, dtype: torch.dtype, device: Any) -> list[Batch]:
    """Length-bucketed batches: plans sorted by length (longest first, so memory errors show at once)."""
    order = sorted(range(len(plans)), key=lambda i: (-len(plans[i].tokens), i))
    batches = []
    for start in range(0, len(order), max(1, batch_size)):
        members = order[start:start + batch_size]
        batches.append(_pad([plans[i] for i in members], members, pad_id, dtype, device))
    return batches


def needed(plan: Plan) -> int:
    """Tokens of a plan the forward must see: up to its last gathered position (later tokens predict nothing,
    and causal attention never lets them change earlier positions), or all of them when nothing is gathered."""
    return max(at for at, _, _ in plan.gathers) + 1 if plan.gathers else len(plan.tokens)


def shift_batch(batch: Batch, offset: int) -> Batch:
    """The same batch with its member indices moved by `offset` (a batch formed within a span of plans)."""
    return replace(batch, members=[m + offset for m in batch.members],
                   gather_member=[m + offset for m in batch.gather_member])


def _pad(plans: list[Plan], members: list[int], pad_id: int, dtype: torch.dtype, device: Any) -> Batch:
    plans = [p if needed(p) == len(p.tokens) else _trim(p) for p in plans]
    width = max(len(p.tokens) for p in plans)
    ids = torch.full((len(plans), width), pad_id, dtype=torch.long)  # [batch, pos]
    packed = any(p.segments is not None for p in plans)
    custom_pos = packed or any(p.positions is not None for p in plans)
    pos = torch.arange(width).repeat(len(plans), 1) if custom_pos else None  # [batch, pos]
    if packed:
        mask = torch.full((len(plans), 1, width, width), torch.finfo(dtype).min, dtype=dtype)  # [batch, 1, q, k]
    else:
        mask = torch.zeros((len(plans), width), dtype=torch.long)  # [batch, pos]
    rows, poss, toks, mem, groups = [], [], [], [], []
    for r, p in enumerate(plans):
        n = len(p.tokens)
        ids[r, :n] = torch.tensor(p.tokens)
        if pos is not None and p.positions is not None:
            pos[r, :n] = torch.tensor(p.positions)
        if packed:
            seg = torch.tensor(p.segments if p.segments is not None else (0,) * n)
            causal = torch.ones(n, n, dtype=torch.bool).tril()  # [q, k]
            same = (seg[None, :] == 0) | (seg[None, :] == seg[:, None])  # [q, k]
            mask[r, 0, :n, :n] = torch.where(causal & same, 0.0, torch.finfo(dtype).min).to(dtype)
            idx = torch.arange(n, width)
            mask[r, 0, idx, idx] = 0.0  # pad queries see themselves only: no fully masked rows
        else:
            mask[r, :n] = 1
        for (at, tok, group) in p.gathers:
            rows.append(r)
            poss.append(at)
            toks.append(tok)
            mem.append(members[r])
            groups.append(group)
    key = tuple((p.tokens, p.positions, p.segments) for p in plans)
    return Batch(
        key=key,
        members=list(members),
        input_ids=to_device(ids, device),
        attention_mask=to_device(mask, device),
        position_ids=to_device(pos, device) if pos is not None else None,
        gather_row=to_device(torch.tensor(rows, dtype=torch.long), device),
        gather_pos=to_device(torch.tensor(poss, dtype=torch.long), device),
        gather_tok=to_device(torch.tensor(toks, dtype=torch.long), device),
        gather_member=mem,
        gather_group=groups,
        gather_tok_host=np.asarray(toks, dtype=np.int64),
    )


def _trim(plan: Plan) -> Plan:
    n = needed(plan)
    return Plan(plan.tokens[:n], plan.gathers, plan.positions[:n] if plan.positions is not None else None,
                plan.segments[:n] if plan.segments is not None else None, min(plan.context_len, n))


def repeat_batch_inputs(batch: Batch, times: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Stack `times` copies of a batch's inputs along the batch axis (one copy per packed ablation set)."""
    if times == 1:
        return batch.input_ids, batch.attention_mask, batch.position_ids
    reps = (times,) + (1,) * (batch.attention_mask.dim() - 1)
    pos = batch.position_ids.repeat(times, 1) if batch.position_ids is not None else None  # [set*batch, pos]
    return batch.input_ids.repeat(times, 1), batch.attention_mask.repeat(*reps), pos
