"""Gradient screen: one forward+backward per batch ranks every head by its predicted effect.

Zeroing head h removes its slice x_h of o_proj's input; to first order an example's objective J
changes by -(dJ/dx_h . x_h) (attribution patching). Summed over positions and averaged over
examples, that is the predicted gain from ablating h. J is the scorer's objective where it is
differentiable: the margin (correct choice's score minus the best wrong one's; for exact answers the
smallest target-token log-probability lead) or the log-probability (of the correct choice among the
choices, or of the answer); with `accuracy` (and for generated tasks) the answer's log-probability stands in.
The gradient norm per head is recorded too (the "how sensitive is the answer" ranking).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from headedit.discovery.objective import effective
from headedit.discovery.scorer import Scorer
from headedit.discovery.table import ScreenResult
from headedit.events import HeadScored, Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.model.heads import HeadLayout
from headedit.tasks.base import Example, Task

STAGE = "screen:gradient"


def gradient_screen(
    engine: Any,
    task: Task,
    examples: Sequence[Example],
    scorer: Scorer,
    layout: HeadLayout,
    reporter: Reporter = null_reporter,
) -> ScreenResult:
    """Attribution and gradient norm per head over the discovery split (the intact model, no ablation)."""
    model = engine.model
    (intact,) = scorer.ensure([()], stage=STAGE)
    objective = effective(scorer.objective, task.kind)
    all_choices = task.kind == "choice" and objective != "accuracy"
    batches = list(engine.answer_batches(task, examples, all_choices=all_choices))
    reporter(StageStarted(STAGE, total=len(batches), description=f"gradient screen ({len(batches)} batches)"))
    attribution = torch.zeros(layout.num_layers, layout.num_heads, dtype=torch.float64)  # [layer, head]
    grad_sq = torch.zeros(layout.num_layers, layout.num_heads, dtype=torch.float64)  # [layer, head]
    used: set[int] = set()
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def capture(layer: int):
        def pre_hook(module: torch.nn.Module, args: tuple) -> None:
            x = args[0]  # [batch, pos, head * d_head]
            x.retain_grad()
            captured[layer] = x
        return pre_hook

    def make_leaf(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.detach().requires_grad_(True)  # gradients flow from here; weights stay frozen

    flags = [p.requires_grad for p in model.parameters()]
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        handles.append(model.get_input_embeddings().register_forward_hook(make_leaf))
        for lay in layout.attention_layers:  # layers without heads have nothing to attribute
            module = model.get_submodule(layout.o_proj_path(lay.layer))
            handles.append(module.register_forward_pre_hook(capture(lay.layer)))
        for i, tb in enumerate(batches):
            scorer.check_cancel()
            captured.clear()
            with torch.enable_grad():
                # the engine's cached batches may have been built under inference_mode (an intact evaluation ran
                # first); clones are ordinary tensors that autograd may save (the packed-endings 4-D mask is)
                kwargs: dict[str, Any] = {"input_ids": tb.input_ids.clone(), "attention_mask": tb.attention_mask.clone()}
                if tb.position_ids is not None:
                    kwargs["position_ids"] = tb.position_ids.clone()
                logits = model(**kwargs).logits  # [batch, pos, vocab]
                logprobs = torch.log_softmax(logits[tb.row, tb.position].float(), dim=-1)  # [n, vocab]
                total = objective_total(task, examples, tb, logprobs, objective)
                if tb.target.numel():
                    total.backward()
            used.update(tb.example)
            rows_pos = tb.attention_mask.dim() == 2
            for layer, x in captured.items():
                g = x.grad
                if g is None:
                    continue
                lay = layout.layer(layer)  # heads and width of this layer (they may differ per layer)
                shape = (x.shape[0], x.shape[1], lay.num_heads, lay.head_width)
                xs = x.detach().float().reshape(shape)  # [batch, pos, head, d_head]
                gs = g.float().reshape(shape)  # [batch, pos, head, d_head]
                if rows_pos:
                    real = tb.attention_mask[:, :, None, None].to(xs.dtype)  # [batch, pos, 1, 1]
                    xs, gs = xs * real, gs * real
                attribution[layer, : lay.num_heads] += -(gs * xs).sum(dim=(0, 1, 3)).double()
                grad_sq[layer, : lay.num_heads] += gs.pow(2).sum(dim=(0, 1, 3)).double()
            reporter(StageProgress(STAGE, i + 1, len(batches)))
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        captured.clear()
    count = max(1, len(used))
    predicted = attribution / count  # [layer, head] mean predicted change in answer log-prob (nats)
    norms = (grad_sq / count).sqrt()
    delta = [[float(v) for v in row] for row in predicted]
    for layer in range(layout.num_layers):
        for head in range(layout.heads_in(layer)):
            reporter(HeadScored(STAGE, layer, head, delta[layer][head], {"grad_norm": float(norms[layer, head])}))
    target = {"margin": "margin", "logprob": "log-probability of the correct answer (among the choices)"}.get(
        objective, "correct answer's log-probability")
    rule = (
        f"attribution: first-order change of the {target} when a head's o_proj input "
        "columns are zeroed, -(grad . activation), summed over positions and averaged over examples; "
        "ranked by this predicted gain (nats); grad_norm = RMS over examples of the gradient's norm"
    )
    result = ScreenResult(
        method="gradient", rule=rule, num_layers=layout.num_layers, num_heads=layout.num_heads,
        intact_acc=float(intact.mean()) if scorer.n else 0.0, delta=delta, evaluations=1,
        unit=f"nats (predicted change in {'answer log-prob' if objective == 'accuracy' else objective})",
        extra={"n": scorer.n, "objective": objective, "examples_with_answer": len(used), "batches": len(batches),
               "grad_norm": [[float(v) for v in row] for row in norms]},
    )
    reporter(StageFinished(STAGE, f"{len(batches)} forward+backward passes over {len(used)} examples"))
    return result


def objective_total(task: Task, examples: Sequence[Example], tb: Any, logprobs: torch.Tensor,
                    objective: str) -> torch.Tensor:
    """Sum over the batch's examples of the differentiable objective, from `logprobs` [gathers, vocab]."""
    lp = logprobs.gather(1, tb.target[:, None])[:, 0]  # [gathers]
    if objective == "accuracy" or task.kind == "generate" or not tb.example:
        return lp.sum()
    owners = sorted(set(tb.example))
    total = lp.new_zeros(())
    if task.kind == "exact":
        if objective == "logprob":
            return lp.sum()
        rival = logprobs.scatter(1, tb.target[:, None], float("-inf")).amax(dim=1)  # [gathers] best other token
        gap = lp - rival  # [gathers]
        for ex in owners:
            mine = torch.tensor([i for i, e in enumerate(tb.example) if e == ex], device=gap.device)
            total = total + gap[mine].min()
        return total
    assert tb.group is not None, "choice objectives need answer_batches(..., all_choices=True)"
    local = {ex: j for j, ex in enumerate(owners)}
    width = max(len(examples[ex].choices) for ex in owners)
    flat = torch.tensor([local[e] * width + g for e, g in zip(tb.example, tb.group)], device=lp.device)
    sums = lp.new_zeros(len(owners) * width).index_add(0, flat, lp).view(len(owners), width)  # [examples, choices]
    for ex in owners:
        example = examples[ex]
        scores = sums[local[ex], : len(example.choices)]  # [choices]
        if task.length_normalize:
            lengths = example.meta.get("choice_lengths") or [len(c.encode("utf-8")) for c in example.choices]
            scores = scores / torch.tensor([max(1, n) for n in lengths], dtype=lp.dtype, device=lp.device)
        label = int(example.label or 0)
        if objective == "margin":
            wrong = torch.cat([scores[:label], scores[label + 1:]])  # [choices - 1]
            total = total + (scores[label] - wrong.max() if wrong.numel() else scores[label] * 0)
        else:
            total = total + torch.log_softmax(scores, dim=0)[label]
    return total
