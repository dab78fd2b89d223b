"""The evaluation engine: per-example correctness of many ablation sets, exact and fast.

What makes it fast, each piece tested for exactness against the plain reference path (`headedit.bench.eval`):
- one teacher-forced forward per example decides greedy exact match (every target token is the argmax);
- single-token choices need one forward per example; multi-token endings are packed after one shared context;
- length-bucketed, right-padded batches (real tokens keep the positions they have unpadded);
- several ablation sets per forward through per-row head masks (`headedit.model.ablation`);
- the intact hidden states entering layer L are computed once per batch and reused by every set whose lowest
  ablated layer is L (an LRU bounded in bytes keeps them across calls on the same examples);
- intact results, tokenization and batches are cached, so discovery can call `correctness` many times cheaply;
- generated tasks reuse the intact model's greedy drafts (`headedit.engine.generate`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence, cast

import numpy as np
import torch

from headedit.engine.batch import (
    Batch,
    Plan,
    PrefilledTokenizer,
    make_batches,
    plan_example,
    repeat_batch_inputs,
    shift_batch,
    stop_token_id,
    texts_to_encode,
)
from headedit.engine.generate import draft_plans, generate_correctness
from headedit.engine.prefix import HiddenCache, gathered_mlp_ok, logits_at, prefix_ok, run_decoder
from headedit.engine.scores import RawScores, aligned_spans, reduce_scores, to_host
from headedit.model.ablation import HeadAblation, heads_to_mask
from headedit.model.heads import Head, HeadLayout
from headedit.tasks.base import Example, Task


@dataclass
class Start:
    """Where a forward starts: `layer`, the states entering it (None at layer 0) and, when cached, o_proj's
    input there (`z`, so that layer's attention need not run: `engine_prefix._CachedAttention`)."""

    layer: int
    states: torch.Tensor | None
    z: torch.Tensor | None


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
    group: list[int] | None = None  # [n] choice index of each gather (choice tasks with `all_choices`)


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
        gathered_mlp: bool | None = None,
        attn_skip: bool | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.layout = layout or HeadLayout.from_model(model)
        self.batch_size = max(1, int(batch_size))
        self.max_rows = max(self.batch_size, int(max_rows or self.batch_size))
        self.chat = bool(chat or chat_template_kwargs)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        fast_ok = prefix_ok(model, self.layout)  # layer surgery only where the decoder is shaped for it
        self.prefix_reuse = prefix_reuse and fast_ok
        # last layer's MLP only where logits are read (engine_prefix._GatheredMLP); default: with prefix reuse
        self.gathered_mlp = (prefix_reuse if gathered_mlp is None else gathered_mlp) and fast_ok and gathered_mlp_ok(model)
        # first layer of an ablated forward runs o_proj only, from the cached intact input (self-checked once)
        self.attn_skip = bool(prefix_reuse if attn_skip is None else attn_skip) and fast_ok
        self._attn_checked = False
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
    def correctness(
        self, task: Task, examples: Sequence[Example], head_sets: Sequence[Iterable[Head]], offset: int = 0,
        block: int | None = None, doubling: bool = False,
    ) -> np.ndarray:
        """bool [len(head_sets), len(examples)]: is each example right under each ablation set (() = intact).

        With `block`, batches never straddle a multiple of `block` in split coordinates (`examples[0]` is
        example `offset` of the split), so calls on different ranges of a split form the same batches and hit
        the same caches (intact scores, hidden states). See `range_eval`.
        """
        return self.evaluate(task, examples, head_sets, "accuracy", offset, block, doubling)[0]

    def evaluate(
        self, task: Task, examples: Sequence[Example], head_sets: Sequence[Iterable[Head]],
        objective: str = "accuracy", offset: int = 0, block: int | None = None, doubling: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(bits, values): `correctness` and, from the same forwards, the per-example discovery objective.

        bits: bool [len(head_sets), len(examples)]; values: float32 [len(head_sets), len(examples)], the
        objective named by `objective` (`headedit.discovery.objective`: accuracy, margin, logprob). Generated
        tasks have no continuous score: their values are the bits.
        """
        sets = [tuple(sorted(set(Head(*h) for h in hs))) for hs in head_sets]
        for hs in sets:
            for h in hs:
                self.layout.check(h)
        values = np.zeros((len(sets), len(examples)), dtype=np.float32)
        if not examples or not sets:
            return np.zeros((len(sets), len(examples)), dtype=bool), values
        if task.kind == "generate":
            bits = generate_correctness(self, task, list(examples), sets)
            return bits, bits.astype(np.float32)
        plans = self.plans(task, examples)
        raw = self.score_plans(plans, sets, spans=aligned_spans(len(examples), offset, block, doubling))
        out = np.zeros((len(sets), len(examples)), dtype=bool)
        row = np.zeros(len(examples), dtype=np.float64)
        for s in range(len(sets)):
            for batch, scores in raw[s]:
                reduce_scores(task, examples, batch, scores, out[s], row, objective)
            values[s] = row
        return out, values

    def range_eval(self, task: Task, examples: Sequence[Example], block: int | None = None, doubling: bool = False):
        """An evaluator `(sets, start, stop) -> bool [sets, stop - start]` over one split, for the discovery scorer.

        Batches never straddle a cut, so the early-stop chunks, the search's looks and later full-split calls
        all reuse the same cached batches and hidden states. Cuts: multiples of `block` (default: the batch
        size), or with `doubling` the looks themselves (block, 2*block, 4*block, ...: fewer, larger batches,
        each at most the batch size).
        """
        examples = list(examples)
        size = int(block or self.batch_size)

        def evaluate(sets: list[tuple[Head, ...]], start: int, stop: int) -> np.ndarray:
            return self.correctness(task, examples[start:stop], sets, offset=start, block=size, doubling=doubling)

        return evaluate

    def plans(self, task: Task, examples: Sequence[Example]) -> list[Plan]:
        """Scoring plans of many examples; the uncached ones are tokenized in one batched call."""
        new = [ex for ex in examples if self._plan_key(task, ex) not in self._plans]
        if len(new) > 1:
            texts: dict[bool, list[str]] = defaultdict(list)
            for ex in new:
                for special, group in texts_to_encode(task, ex, self.tokenizer, self.chat,
                                                      self.chat_template_kwargs).items():
                    texts[special].extend(group)
            tok = PrefilledTokenizer(self.tokenizer, dict(texts))
            for ex in new:
                self.plan(task, ex, tok)
        return [self.plan(task, ex)[0] for ex in examples]

    def _plan_key(self, task: Task, example: Example) -> tuple:
        return (task.name, task.kind, example.prompt, example.target, example.choices, self.chat)

    def plan(self, task: Task, example: Example, tokenizer: Any = None) -> tuple[Plan, tuple]:
        """(scoring plan, continuation token ids) of one example, cached."""
        key = self._plan_key(task, example)
        hit = self._plans.get(key)
        if hit is None:
            hit = plan_example(task, example, tokenizer or self.tokenizer, self.chat, self.chat_template_kwargs,
                               self.stop_id)
            self._plans[key] = hit
        return hit

    def answer_batches(self, task: Task, examples: Sequence[Example], all_choices: bool = False) -> Iterator[TargetBatch]:
        """Batches for a caller's own forward+backward; see `TargetBatch`. No ablation is applied here.

        With `all_choices`, choice tasks keep the gathers of every choice (`TargetBatch.group` says which), so a
        caller can form the margin or the choice probability, not just the correct choice's log-probability.
        """
        if task.kind == "generate":
            plans, keep = draft_plans(self, task, list(examples))
        else:
            plans, keep = self.plans(task, examples), list(range(len(examples)))
        for batch in self.batches([plans[i] for i in range(len(plans))]):
            rows, poss, toks, exs, groups = [], [], [], [], []
            assert batch.gather_tok_host is not None  # make_batches always sets it
            all_rows, all_pos = batch.gather_row.tolist(), batch.gather_pos.tolist()  # one transfer each
            for i in range(len(batch.gather_member)):
                member = batch.gather_member[i]
                ex = examples[keep[member]]
                if task.kind == "choice" and batch.gather_group[i] != ex.label and not all_choices:
                    continue
                rows.append(all_rows[i])
                poss.append(all_pos[i])
                toks.append(int(batch.gather_tok_host[i]))
                exs.append(keep[member])
                groups.append(int(batch.gather_group[i]) if task.kind == "choice" else 0)
            dev = batch.input_ids.device
            yield TargetBatch(
                batch.input_ids, batch.attention_mask, batch.position_ids,
                torch.tensor(rows, dtype=torch.long, device=dev), torch.tensor(poss, dtype=torch.long, device=dev),
                torch.tensor(toks, dtype=torch.long, device=dev), exs, groups if all_choices else None,
            )

    def clear_caches(self) -> None:
        self.hidden.clear()
        self._plans.clear()
        self._batches.clear()
        self._intact.clear()
        self._drafts.clear()

    # ---- scoring kernel -------------------------------------------------------------------
    def batches(self, plans: Sequence[Plan], spans: Sequence[tuple[int, int]] | None = None) -> list[Batch]:
        """Padded batches of `plans`, formed within each span [a, b) of plan indices (cached by content)."""
        out: list[Batch] = []
        for a, b in spans or [(0, len(plans))]:
            key = tuple(plans[a:b])
            hit = self._batches.get(key)
            if hit is None:
                hit = make_batches(plans[a:b], self.batch_size, self.pad_id, self.dtype, self.device)
                if len(self._batches) > 256:
                    self._batches.pop(next(iter(self._batches)))
                self._batches[key] = hit
            out.extend(hit if a == 0 else [shift_batch(batch, a) for batch in hit])
        return out

    @torch.inference_mode()
    def score_plans(
        self, plans: Sequence[Plan], sets: Sequence[tuple[Head, ...]], spans: Sequence[tuple[int, int]] | None = None
    ) -> list[list[tuple[Batch, RawScores]]]:
        """For every set, [(batch, raw scores)] covering all plans.

        Each ablated set starts at the deepest cached *node*: the states entering layer L under the set's heads
        below L (the intact states, below its lowest ablated layer). A node that two or more sets of the call
        share and that is not cached yet is computed once (e.g. the beam's base set {a} for every {a, b} with b
        above a's layer). Sets starting at the same layer are packed into one forward (per-row masks).
        """
        out: list[list[tuple[Batch, RawScores]]] = [[] for _ in sets]
        intact_sets = [s for s, hs in enumerate(sets) if not hs]
        ablated = [s for s, hs in enumerate(sets) if hs]
        ablation = HeadAblation(self.model, self.layout)
        ablation.attach()
        try:
            for batch in self.batches(plans, spans):
                lows = sorted({min(h.layer for h in sets[s]) for s in ablated}) if self.prefix_reuse else []
                self._prefix_states(batch, lows, need_intact=bool(intact_sets))
                for s in intact_sets:
                    out[s].append((batch, self._intact[batch.key]))
                if self.prefix_reuse:
                    self._shared_nodes(batch, [sets[s] for s in ablated], ablation)
                by_layer: dict[int, list[tuple[int, Start]]] = defaultdict(list)
                for s in ablated:
                    start = self._start(batch, sets[s]) if self.prefix_reuse else Start(0, None, None)
                    by_layer[start.layer].append((s, start))
                for layer in sorted(by_layer):
                    members = by_layer[layer]
                    per = max(1, self.max_rows // batch.rows)
                    for at in range(0, len(members), per):
                        pack = members[at:at + per]
                        scores = self._forward_sets(batch, [sets[s] for s, _ in pack], layer,
                                                    [st for _, st in pack], ablation)
                        for (s, _), sc in zip(pack, scores):
                            out[s].append((batch, sc))
        finally:
            ablation.detach()
        to_host({id(sc): sc for row in out for _, sc in row}.values())
        return out

    def _node(self, batch: Batch, base: tuple[Head, ...], layer: int, attn: bool = False) -> tuple:
        """Cache key of the states entering `layer` (or, `attn`, o_proj's input there) under ablation `base`."""
        return (batch.key, base, layer, "attn") if attn else (batch.key, base, layer)

    def _at(self, batch: Batch, base: tuple[Head, ...], layer: int) -> "Start | None":
        states = self.hidden.get(self._node(batch, base, layer)) if layer > 0 else None
        if layer > 0 and states is None:
            return None
        z = self.hidden.get(self._node(batch, base, layer, attn=True)) if self.attn_skip else None
        return Start(layer, states, z)

    def _start(self, batch: Batch, hs: tuple[Head, ...], below: int | None = None) -> "Start":
        """Where to start `hs` from: the deepest cached node (layers < `below` if given), else its lowest layer."""
        layers = sorted({h.layer for h in hs if below is None or h.layer < below})
        for L in reversed(layers[1:]):
            found = self._at(batch, tuple(h for h in hs if h.layer < L), L)
            if found is not None:
                return found
        if not layers:
            return Start(0, None, None)
        return self._at(batch, (), layers[0]) or Start(0, None, None)

    def _shared_nodes(self, batch: Batch, sets: list[tuple[Head, ...]], ablation: HeadAblation) -> None:
        """Compute (once) every uncached node deeper than a set's start that two or more sets share."""
        count: dict[tuple[tuple[Head, ...], int], int] = defaultdict(int)
        for hs in sets:
            start = self._start(batch, hs).layer
            for L in sorted({h.layer for h in hs}):
                if L > start:
                    count[(tuple(h for h in hs if h.layer < L), L)] += 1
        for base, layer in sorted((k for k, c in count.items() if c > 1), key=lambda k: (k[1], k[0])):
            if self._at(batch, base, layer) is not None:
                continue
            st = self._start(batch, base)
            ablation.set_mask(heads_to_mask(self.layout, [base]).repeat_interleave(batch.rows, dim=0))
            try:
                _, captured = run_decoder(
                    self.model, batch.input_ids, batch.attention_mask, batch.position_ids,
                    start_layer=st.layer, hidden_in=st.states, attn_in=st.z, capture=[layer],
                    capture_attn=[layer] if self.attn_skip else [], only_capture=True,
                )
            finally:
                ablation.clear()
            self.forwards += 1
            self.hidden.put(self._node(batch, base, layer), captured[layer])
            if self.attn_skip:
                self.hidden.put(self._node(batch, base, layer, attn=True), captured[("attn", layer)])

    def _prefix_states(self, batch: Batch, lows: list[int], need_intact: bool) -> None:
        """Cache the intact states entering each layer of `lows` (o_proj inputs too), and the intact scores."""
        missing = [L for L in lows if L > 0 and self.hidden.get(self._node(batch, (), L)) is None]
        missing_z = [L for L in lows if self.attn_skip and self.hidden.get(self._node(batch, (), L, True)) is None]
        have_intact = batch.key in self._intact
        if missing or missing_z or (need_intact and not have_intact):
            final, captured = run_decoder(
                self.model, batch.input_ids, batch.attention_mask, batch.position_ids,
                capture=missing, only_capture=have_intact, read_at=self._read_at(batch, 1), capture_attn=missing_z,
            )
            self.forwards += 1
            if final is not None:
                self._intact[batch.key] = self._raw(final, batch, 1)[0]
            for key, states in captured.items():
                attn = isinstance(key, tuple)
                self.hidden.put(self._node(batch, (), key[1] if attn else key, attn=attn), states)

    def _forward_sets(
        self, batch: Batch, sets: list[tuple[Head, ...]], start: int, starts: list["Start"], ablation: HeadAblation,
    ) -> list[RawScores]:
        """One forward for several sets at once (per-row masks), from layer `start` with each set's start states."""
        k = len(sets)
        ids, mask, pos = repeat_batch_inputs(batch, k)
        head_mask = heads_to_mask(self.layout, list(sets)).repeat_interleave(batch.rows, dim=0)  # [set*batch, L, H]
        ablation.set_mask(head_mask)
        read_at = self._read_at(batch, k)
        hidden_in = attn_in = None
        if start > 0 and all(st.states is not None for st in starts):
            hidden_in = torch.cat([cast(torch.Tensor, st.states) for st in starts], dim=0) if k > 1 else starts[0].states
        if (start == 0 or hidden_in is not None) and self.attn_skip and all(st.z is not None for st in starts):
            attn_in = torch.cat([cast(torch.Tensor, st.z) for st in starts], dim=0) if k > 1 else starts[0].z  # [set*batch, pos, H*d]
        first = start if hidden_in is not None else 0
        try:
            final, _ = run_decoder(self.model, ids, mask, pos, start_layer=first, hidden_in=hidden_in,
                                   read_at=read_at, attn_in=attn_in if first == start else None)
            assert final is not None  # only_capture is off: the forward runs to the end
            if attn_in is not None and first == start and not self._attn_checked:
                # one-time self-check: o_proj-only first layer equals running its attention (else switch it off)
                plain, _ = run_decoder(self.model, ids, mask, pos, start_layer=first, hidden_in=hidden_in,
                                       read_at=read_at)
                assert plain is not None  # as above
                self._attn_checked = True
                if not torch.equal(plain, final):
                    self.attn_skip, final = False, plain
        finally:
            ablation.clear()
        self.forwards += 1
        return self._raw(final, batch, k)

    def _read_at(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows, positions) of every gather in `k` stacked copies of the batch; None when not restricting."""
        if not self.gathered_mlp or batch.gather_row.numel() == 0:
            return None
        n = batch.gather_row.numel()
        offsets = torch.arange(k, device=batch.gather_row.device).repeat_interleave(n) * batch.rows  # [set*n]
        return batch.gather_row.repeat(k) + offsets, batch.gather_pos.repeat(k)

    def _raw(self, final: torch.Tensor, batch: Batch, k: int) -> list[RawScores]:
        n = batch.gather_row.numel()
        offsets = torch.arange(k, device=final.device).repeat_interleave(n) * batch.rows  # [set*n]
        rows = batch.gather_row.repeat(k) + offsets
        logits = logits_at(self.model, final, rows, batch.gather_pos.repeat(k))  # [set*n, vocab]
        logp = torch.log_softmax(logits, dim=-1)
        toks = batch.gather_tok.repeat(k)
        lp = logp.gather(1, toks[:, None])[:, 0].double()  # [set*n]
        am = logits.argmax(dim=-1)  # [set*n]
        top = logp.topk(min(2, logp.shape[-1]), dim=-1).values  # [set*n, 2]
        # best log-probability of any token but the target (the exact-match margin's rival)
        other = torch.where(am == toks, top[:, -1], top[:, 0]).double()  # [set*n]
        return [RawScores(lp[i * n:(i + 1) * n], am[i * n:(i + 1) * n], other[i * n:(i + 1) * n]) for i in range(k)]
