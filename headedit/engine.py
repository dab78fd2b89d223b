"""The evaluation engine: per-example correctness of many ablation sets, exact and fast.

What makes it fast, each piece tested for exactness against the plain reference path (`headedit.bench_eval`):
- one teacher-forced forward per example decides greedy exact match (every target token is the argmax);
- single-token choices need one forward per example; multi-token endings are packed after one shared context;
- length-bucketed, right-padded batches (real tokens keep the positions they have unpadded);
- several ablation sets per forward through per-row head masks (`headedit.ablation`);
- the intact hidden states entering layer L are computed once per batch and reused by every set whose lowest
  ablated layer is L (an LRU bounded in bytes keeps them across calls on the same examples);
- intact results, tokenization and batches are cached, so discovery can call `correctness` many times cheaply;
- generated tasks reuse the intact model's greedy drafts (`headedit.engine_generate`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from .ablation import HeadAblation, heads_to_mask
from .engine_batch import Batch, Plan, make_batches, plan_example, repeat_batch_inputs, stop_token_id
from .engine_prefix import HiddenCache, logits_at, run_decoder
from .heads import Head, HeadLayout
from .tasks.base import Example, Task


@dataclass
class RawScores:
    """Per gather of one batch under one ablation set: log-probability of the target and the argmax token."""

    logprob: np.ndarray  # [n_gathers] float64
    argmax: np.ndarray  # [n_gathers] int64


@dataclass
class TargetBatch:
    """Inputs and answer positions for a caller's own forward/backward (e.g. the gradient screen).

    `logits[row[i], position[i]]` predicts `target[i]`; summing log-probabilities per `example[i]` gives each
    example's answer log-probability (exact: the target tokens; choice: the correct choice; generate: the
    intact greedy answer, for examples the intact model gets right). Pass `position_ids` when not None.
    """

    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos], or [batch, 1, pos, pos] additive for packed endings
    position_ids: torch.Tensor | None  # [batch, pos]
    row: torch.Tensor  # [n]
    position: torch.Tensor  # [n]
    target: torch.Tensor  # [n]
    example: list[int]  # [n] index into the caller's example list


class Engine:
    """Scores tasks under many head ablations; see the module docstring for what is cached and why it is exact."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        layout: HeadLayout | None = None,
        batch_size: int = 16,
        chat_template_kwargs: dict | None = None,
        chat: bool = False,
        prefix_reuse: bool = True,
        max_rows: int | None = None,
        prefix_cache_bytes: int = 1 << 30,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.layout = layout or HeadLayout.from_model(model)
        self.batch_size = max(1, int(batch_size))
        self.max_rows = max(self.batch_size, int(max_rows or self.batch_size))
        self.chat = bool(chat or chat_template_kwargs)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.prefix_reuse = prefix_reuse
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.stop_id = stop_token_id(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (tokenizer.eos_token_id or 0))
        self.hidden = HiddenCache(prefix_cache_bytes)
        self._plans: dict[tuple, tuple[Plan, tuple]] = {}
        self._batches: dict[tuple, list[Batch]] = {}
        self._intact: dict[tuple, RawScores] = {}
        self._drafts: dict[tuple, Any] = {}
        self.forwards = 0  # forward passes run, for benchmarks

    # ---- public API -----------------------------------------------------------------------
    def correctness(self, task: Task, examples: Sequence[Example], head_sets: Sequence[Iterable[Head]]) -> np.ndarray:
        """bool [len(head_sets), len(examples)]: is each example right under each ablation set (() = intact)."""
        sets = [tuple(sorted(set(Head(*h) for h in hs))) for hs in head_sets]
        for hs in sets:
            for h in hs:
                self.layout.check(h)
        if not examples or not sets:
            return np.zeros((len(sets), len(examples)), dtype=bool)
        if task.kind == "generate":
            from .engine_generate import generate_correctness

            return generate_correctness(self, task, list(examples), sets)
        plans = self.plans(task, examples)
        raw = self.score_plans(plans, sets)
        out = np.zeros((len(sets), len(examples)), dtype=bool)
        for s in range(len(sets)):
            for batch, scores in raw[s]:
                self._reduce(task, examples, batch, scores, out[s])
        return out

    def plans(self, task: Task, examples: Sequence[Example]) -> list[Plan]:
        return [self.plan(task, ex)[0] for ex in examples]

    def plan(self, task: Task, example: Example) -> tuple[Plan, tuple]:
        """(scoring plan, continuation token ids) of one example, cached."""
        key = (task.name, task.kind, example.prompt, example.target, example.choices, self.chat)
        hit = self._plans.get(key)
        if hit is None:
            hit = plan_example(task, example, self.tokenizer, self.chat, self.chat_template_kwargs, self.stop_id)
            self._plans[key] = hit
        return hit

    def answer_batches(self, task: Task, examples: Sequence[Example]) -> Iterator[TargetBatch]:
        """Batches for a caller's own forward+backward; see `TargetBatch`. No ablation is applied here."""
        if task.kind == "generate":
            from .engine_generate import draft_plans

            plans, keep = draft_plans(self, task, list(examples))
        else:
            plans, keep = self.plans(task, examples), list(range(len(examples)))
        for batch in self.batches([plans[i] for i in range(len(plans))]):
            rows, poss, toks, exs = [], [], [], []
            for i in range(len(batch.gather_member)):
                member = batch.gather_member[i]
                ex = examples[keep[member]]
                if task.kind == "choice" and batch.gather_group[i] != ex.label:
                    continue
                rows.append(int(batch.gather_row[i]))
                poss.append(int(batch.gather_pos[i]))
                toks.append(int(batch.gather_tok[i]))
                exs.append(keep[member])
            dev = batch.input_ids.device
            yield TargetBatch(
                batch.input_ids, batch.attention_mask, batch.position_ids,
                torch.tensor(rows, dtype=torch.long, device=dev), torch.tensor(poss, dtype=torch.long, device=dev),
                torch.tensor(toks, dtype=torch.long, device=dev), exs,
            )

    def clear_caches(self) -> None:
        self.hidden.clear()
        self._plans.clear()
        self._batches.clear()
        self._intact.clear()
        self._drafts.clear()

    # ---- scoring kernel -------------------------------------------------------------------
    def batches(self, plans: Sequence[Plan]) -> list[Batch]:
        key = tuple(plans)
        hit = self._batches.get(key)
        if hit is None:
            hit = make_batches(plans, self.batch_size, self.pad_id, self.dtype, self.device)
            if len(self._batches) > 64:
                self._batches.pop(next(iter(self._batches)))
            self._batches[key] = hit
        return hit

    @torch.no_grad()
    def score_plans(self, plans: Sequence[Plan], sets: Sequence[tuple[Head, ...]]) -> list[list[tuple[Batch, RawScores]]]:
        """For every set, [(batch, raw scores)] covering all plans."""
        out: list[list[tuple[Batch, RawScores]]] = [[] for _ in sets]
        groups: dict[int, list[int]] = defaultdict(list)  # lowest ablated layer -> set indices
        intact_sets = []
        for s, hs in enumerate(sets):
            if hs:
                groups[min(h.layer for h in hs) if self.prefix_reuse else 0].append(s)
            else:
                intact_sets.append(s)
        ablation = HeadAblation(self.model, self.layout)
        ablation.attach()
        try:
            for batch in self.batches(plans):
                hidden = self._prefix_states(batch, sorted(L for L in groups if L > 0), need_intact=bool(intact_sets))
                for s in intact_sets:
                    out[s].append((batch, self._intact[batch.key]))
                for layer in sorted(groups):
                    members = groups[layer]
                    per = max(1, self.max_rows // batch.rows)
                    for start in range(0, len(members), per):
                        pack = members[start:start + per]
                        scores = self._forward_sets(batch, [sets[s] for s in pack], layer, hidden.get(layer), ablation)
                        for s, sc in zip(pack, scores):
                            out[s].append((batch, sc))
        finally:
            ablation.detach()
        return out

    def _prefix_states(self, batch: Batch, layers: list[int], need_intact: bool) -> dict[int, torch.Tensor]:
        """Intact hidden states entering each of `layers` for this batch (cached), and the intact scores."""
        found = {L: self.hidden.get((batch.key, L)) for L in layers}
        missing = [L for L, v in found.items() if v is None]
        have_intact = batch.key in self._intact
        if missing or (need_intact and not have_intact):
            final, captured = run_decoder(
                self.model, batch.input_ids, batch.attention_mask, batch.position_ids,
                capture=missing, only_capture=have_intact,
            )
            self.forwards += 1
            if final is not None:
                self._intact[batch.key] = self._raw(final, batch, 1)[0]
            for L, states in captured.items():
                self.hidden.put((batch.key, L), states)
                found[L] = states
        return found  # type: ignore[return-value]

    def _forward_sets(
        self, batch: Batch, sets: list[tuple[Head, ...]], start: int, hidden: torch.Tensor | None, ablation: HeadAblation
    ) -> list[RawScores]:
        """One forward for several sets at once (per-row masks), starting at layer `start` when states are given."""
        k = len(sets)
        ids, mask, pos = repeat_batch_inputs(batch, k)
        head_mask = heads_to_mask(self.layout, list(sets)).repeat_interleave(batch.rows, dim=0)  # [set*batch, L, H]
        ablation.set_mask(head_mask)
        try:
            if start > 0 and hidden is not None:
                reps = hidden.repeat(k, 1, 1) if k > 1 else hidden  # [set*batch, pos, hidden]
                final, _ = run_decoder(self.model, ids, mask, pos, start_layer=start, hidden_in=reps)
            else:
                final, _ = run_decoder(self.model, ids, mask, pos)
        finally:
            ablation.clear()
        self.forwards += 1
        return self._raw(final, batch, k)

    def _raw(self, final: torch.Tensor, batch: Batch, k: int) -> list[RawScores]:
        n = batch.gather_row.numel()
        offsets = torch.arange(k, device=final.device).repeat_interleave(n) * batch.rows  # [set*n]
        rows = batch.gather_row.repeat(k) + offsets
        logits = logits_at(self.model, final, rows, batch.gather_pos.repeat(k))  # [set*n, vocab]
        logp = torch.log_softmax(logits, dim=-1)
        toks = batch.gather_tok.repeat(k)
        lp = logp.gather(1, toks[:, None])[:, 0].double().cpu().numpy()
        am = logits.argmax(dim=-1).cpu().numpy()
        return [RawScores(lp[i * n:(i + 1) * n], am[i * n:(i + 1) * n]) for i in range(k)]

    # ---- reductions -----------------------------------------------------------------------
    def _reduce(self, task: Task, examples: Sequence[Example], batch: Batch, sc: RawScores, out: np.ndarray) -> None:
        tok = batch.gather_tok.cpu().numpy()
        if task.kind == "exact":
            ok: dict[int, bool] = {m: True for m in batch.members}
            for i, m in enumerate(batch.gather_member):
                if sc.argmax[i] != tok[i]:
                    ok[m] = False
            for m, v in ok.items():
                out[m] = v
            return
        totals: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for i, m in enumerate(batch.gather_member):
            totals[m][batch.gather_group[i]] += float(sc.logprob[i])
        for m in batch.members:
            ex = examples[m]
            scores = [totals[m][k] for k in range(len(ex.choices))]
            if task.length_normalize:
                lengths = ex.meta.get("choice_lengths") or [len(c.encode("utf-8")) for c in ex.choices]
                scores = [s / max(1, n) for s, n in zip(scores, lengths)]
            out[m] = int(np.argmax(scores)) == ex.label
