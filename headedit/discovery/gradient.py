"""Gradient screen: one forward+backward per batch ranks every head by its predicted effect.

Zeroing head h removes its slice x_h of o_proj's input; to first order the answer's
log-probability changes by -(dL/dx_h . x_h) (attribution patching). Summed over the answer
positions' prefix and averaged over examples, that is the predicted gain from ablating h.
The gradient norm per head is recorded too (the "how sensitive is the answer" ranking).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from headedit.events import HeadScored, Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.model.heads import HeadLayout
from headedit.tasks.base import Example, Task
from headedit.discovery.scorer import Scorer
from headedit.discovery.table import ScreenResult

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
    batches = list(engine.answer_batches(task, examples))
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
        for layer in range(layout.num_layers):
            module = model.get_submodule(layout.o_proj_path(layer))
            handles.append(module.register_forward_pre_hook(capture(layer)))
        for i, tb in enumerate(batches):
            scorer.check_cancel()
            captured.clear()
            with torch.enable_grad():
                kwargs: dict[str, Any] = {"input_ids": tb.input_ids, "attention_mask": tb.attention_mask}
                if tb.position_ids is not None:
                    kwargs["position_ids"] = tb.position_ids
                logits = model(**kwargs).logits  # [batch, pos, vocab]
                logprobs = torch.log_softmax(logits[tb.row, tb.position].float(), dim=-1)  # [n, vocab]
                total = logprobs.gather(1, tb.target[:, None]).sum()
                if tb.target.numel():
                    total.backward()
            used.update(tb.example)
            rows_pos = tb.attention_mask.dim() == 2
            for layer, x in captured.items():
                g = x.grad
                if g is None:
                    continue
                shape = (x.shape[0], x.shape[1], layout.num_heads, layout.head_dim)
                xs = x.detach().float().reshape(shape)  # [batch, pos, head, d_head]
                gs = g.float().reshape(shape)  # [batch, pos, head, d_head]
                if rows_pos:
                    real = tb.attention_mask[:, :, None, None].to(xs.dtype)  # [batch, pos, 1, 1]
                    xs, gs = xs * real, gs * real
                attribution[layer] += -(gs * xs).sum(dim=(0, 1, 3)).double()
                grad_sq[layer] += gs.pow(2).sum(dim=(0, 1, 3)).double()
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
        for head in range(layout.num_heads):
            reporter(HeadScored(STAGE, layer, head, delta[layer][head], {"grad_norm": float(norms[layer, head])}))
    rule = (
        "attribution: first-order change of the correct answer's log-probability when a head's o_proj input "
        "columns are zeroed, -(grad . activation), summed over positions and averaged over examples; "
        "ranked by this predicted gain (nats); grad_norm = RMS over examples of the gradient's norm"
    )
    result = ScreenResult(
        method="gradient", rule=rule, num_layers=layout.num_layers, num_heads=layout.num_heads,
        intact_acc=float(intact.mean()) if scorer.n else 0.0, delta=delta, evaluations=1,
        unit="nats (predicted change in answer log-prob)",
        extra={"n": scorer.n, "examples_with_answer": len(used), "batches": len(batches),
               "grad_norm": [[float(v) for v in row] for row in norms]},
    )
    reporter(StageFinished(STAGE, f"{len(batches)} forward+backward passes over {len(used)} examples"))
    return result
