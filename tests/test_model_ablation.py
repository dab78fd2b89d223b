"""Hook ablation: per-row masks equal one set at a time, and hooks are removed even when the forward fails."""
from __future__ import annotations

import pytest
import torch
from testkit.models import family_model

from headedit import HeadLayout, ablate, parse_heads
from headedit.model.ablation import heads_to_mask

INPUT = torch.tensor([[1, 5, 9, 13, 2, 7, 40, 3], [4, 4, 8, 15, 16, 23, 42, 11]])


def logits(model, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT, **kw).logits


def test_per_row_mask_equals_one_set_at_a_time():
    model = family_model("llama-gqa")
    layout = HeadLayout.from_model(model)
    sets = [(), parse_heads("0.1"), parse_heads("1.0,2.3"), parse_heads("0.0,0.1,0.2,0.3")]
    ids = INPUT[:1].repeat(len(sets), 1)  # [set, pos]
    mask = heads_to_mask(layout, sets)  # [set, layer, head]
    with ablate(model, layout, mask=mask), torch.no_grad():
        packed = model(input_ids=ids).logits
    for row, heads in enumerate(sets):
        with ablate(model, layout, heads=heads), torch.no_grad():
            single = model(input_ids=INPUT[:1]).logits
        assert torch.equal(packed[row], single[0]), row


def test_hooks_removed_even_on_error():
    model = family_model("llama")
    before = logits(model)
    with pytest.raises(RuntimeError):
        with ablate(model, heads=parse_heads("0.0")):
            raise RuntimeError("boom")
    assert torch.equal(logits(model), before)
    assert all(not m._forward_pre_hooks for m in model.modules())


