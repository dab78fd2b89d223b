"""Gradient screen: its attribution equals the directional derivative of the answer log-prob (finite differences)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from headedit.bench.tiny import tiny_model, tiny_tokenizer  # noqa: E402
from headedit.discovery.gradient import gradient_screen  # noqa: E402
from headedit.discovery.scorer import Scorer  # noqa: E402
from headedit.engine.core import Engine  # noqa: E402
from headedit.journal import Journal  # noqa: E402
from headedit.model.heads import HeadLayout  # noqa: E402
from headedit.tasks import get_task  # noqa: E402

torch.set_num_threads(1)


def _answer_logprob(engine: Engine, task, examples, scale: dict[tuple[int, int], float]) -> float:
    """Sum of answer log-probs with head (L, H)'s o_proj input scaled by scale[(L, H)]."""
    layout = engine.layout
    handles = []
    for (layer, head), factor in scale.items():
        cols = layout.columns(head)

        def hook(module, args, cols=cols, factor=factor):
            x = args[0].clone()  # [batch, pos, head * d_head]
            x[..., cols] *= factor
            return (x,)

        handles.append(engine.model.get_submodule(layout.o_proj_path(layer)).register_forward_pre_hook(hook))
    total = 0.0
    try:
        with torch.no_grad():
            for tb in engine.answer_batches(task, examples):
                kw = {"input_ids": tb.input_ids, "attention_mask": tb.attention_mask}
                if tb.position_ids is not None:
                    kw["position_ids"] = tb.position_ids
                logits = engine.model(**kw).logits
                lp = torch.log_softmax(logits[tb.row, tb.position].double(), -1)
                total += float(lp.gather(1, tb.target[:, None]).sum())
    finally:
        for h in handles:
            h.remove()
    return total


def test_gradient_attribution_matches_finite_difference(tmp_path) -> None:
    model = tiny_model(dtype=torch.float64, num_hidden_layers=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = Engine(model, tiny_tokenizer(), batch_size=8)
    layout = HeadLayout.from_model(model)
    task = get_task("coin-test")
    examples = list(task.load("discovery", 24).examples)

    def eval_fn(sets, a, b):
        return engine.correctness(task, examples[a:b], sets)

    scorer = Scorer(Journal(tmp_path / "j.sqlite"), "discovery", len(examples), eval_fn)
    screen = gradient_screen(engine, task, examples, scorer, layout)
    assert screen.method == "gradient" and "-(grad . activation)" in screen.rule
    assert screen.extra["examples_with_answer"] == len(examples)
    # central difference (parts of the forward, e.g. rotary tables, run in float32, so eps cannot be tiny)
    eps = 1e-3
    for layer, head in [(0, 0), (0, 3), (1, 1), (1, 2)]:
        down = _answer_logprob(engine, task, examples, {(layer, head): 1 - eps})
        up = _answer_logprob(engine, task, examples, {(layer, head): 1 + eps})
        derivative = (down - up) / (2 * eps)  # d/dt of logprob when the head is scaled by (1 - t)
        predicted = screen.delta[layer][head] * len(examples)
        assert abs(predicted - derivative) <= 1e-3 * max(1.0, abs(derivative)), (layer, head, predicted, derivative)
    assert all(n > 0 for row in screen.extra["grad_norm"] for n in row)
    # the model is untouched: same weights, gradients off as before
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())
