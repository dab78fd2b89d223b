"""The model zoo: tiny random models of every decoder family headedit claims, built from transformers' own
config classes (nothing downloaded), each checked end to end.

For every supported `model_type`: the geometry found on the meta device from config.json equals the one
walked on the loaded model; `inspect` works; the baked, reloaded checkpoint gives exactly the hook-ablated
logits (fp32, eager attention, `torch.equal`); only the named heads' input slices of the projection weight
changed (every other tensor, biases included, byte-identical); and, where the family's attention goes
through transformers' attention interface, zeroing those heads' outputs inside attention gives the same
logits, so the slice is the head. Hybrids refuse heads in their layers without softmax heads. Families that
cannot work are listed with the reason, and their refusal is checked.

The families and builders are in tests/testkit/zoo.py (`scripts/support_table.py` prints README's table from it).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from testkit import zoo
from testkit.zoo import (
    FAMILIES,
    IDS,
    NOT_VERIFIED,
    REFUSED,
    Family,
    build,
    check_only_slices_changed,
    chosen_heads,
    logits,
    probed_logits,
    tiny_config,
)

from headedit.errors import HeadeditError, HeadSpecError
from headedit.export.bake import bake
from headedit.model.ablation import ablate
from headedit.model.geometry import HeadGeometry
from headedit.model.heads import format_heads, parse_heads


def _params(family: Family) -> Any:
    marks = () if family.fast else (pytest.mark.slow,)
    return pytest.param(family, id=family.model_type, marks=marks)


@pytest.mark.parametrize("family", [_params(f) for f in FAMILIES])
def test_family_bakes_exactly(family: Family, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from headedit.model.inspect import inspect_model

    model = build(family.model_type, family.kwargs)
    walked = HeadGeometry.from_model(model)
    src = tmp_path / "src"
    model.save_pretrained(src)
    config = json.loads((src / "config.json").read_text())
    geometry = HeadGeometry.from_config(config)  # meta device, from the file alone
    assert geometry == walked
    assert geometry.o_proj_template == family.projection
    info = inspect_model(str(src))
    assert (info["num_layers"], info["num_heads"]) == (geometry.num_layers, geometry.num_heads)
    assert [d["layer"] for d in info["layers_without_heads"]] == [lay.layer for lay in geometry.layers_without_heads]

    heads = chosen_heads(geometry)
    intact = logits(model)
    with ablate(model, geometry, heads=heads):
        hooked = logits(model)
    assert not torch.equal(hooked, intact)
    out = bake(src, format_heads(heads), tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    assert torch.equal(logits(reloaded), hooked)
    check_only_slices_changed(src, out, geometry, heads)

    probed = probed_logits(model, geometry, heads)
    if family.probe == "n/a":
        assert probed is None
    elif family.probe == "exact":
        assert probed is not None and torch.equal(probed, hooked)
    else:
        assert probed is not None and not torch.equal(probed, hooked)

    for lay in geometry.layers_without_heads:  # hybrids: no head can be named there
        with pytest.raises(HeadSpecError, match=f"layer {lay.layer}, which has no attention heads"):
            bake(src, f"{lay.layer}.0", tmp_path / "refused")
        with pytest.raises(HeadSpecError, match="no attention heads"):
            parse_heads(f"{lay.layer}.*", geometry)
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("family", [_params(f) for f in FAMILIES])
def test_engine_reads_the_family_exactly(family: Family) -> None:
    """The engine's forward (decoder, then lm_head where logits are read, then the family's own logit scaling)
    gives the model's logits; where its layer surgery applies, starting at a later layer from the cached states
    (and that layer's attention from its cached projection input) is bit-identical under ablation."""
    from headedit.engine.prefix import logits_at, prefix_ok, run_decoder

    model = build(family.model_type, family.kwargs)
    geometry = HeadGeometry.from_model(model)
    mask = torch.ones_like(IDS)  # [batch, pos]
    rows, positions = torch.arange(2).repeat_interleave(8), torch.arange(8).repeat(2)  # every (row, position)
    with torch.no_grad():
        final, captured = run_decoder(model, IDS, mask, capture=[1], capture_attn=[1] if prefix_ok(model, geometry) else [])
        ours = logits_at(model, final, rows, positions)  # [16, vocab]
    theirs = logits(model)[rows, positions].float()  # [16, vocab]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    if not prefix_ok(model, geometry):
        return
    heads = tuple(h for h in chosen_heads(geometry) if h.layer >= 1)
    with ablate(model, geometry, heads=heads), torch.no_grad():
        whole, _ = run_decoder(model, IDS, mask)
        resumed, _ = run_decoder(model, IDS, mask, start_layer=1, hidden_in=captured[1])
        attn_skipped, _ = run_decoder(model, IDS, mask, start_layer=1, hidden_in=captured[1],
                                      attn_in=captured[("attn", 1)])
    assert torch.equal(resumed, whole) and torch.equal(attn_skipped, whole)


@pytest.mark.parametrize("model_type", list(REFUSED))
def test_family_refused_with_reason(model_type: str) -> None:
    _, match, kwargs = REFUSED[model_type]
    config = tiny_config(model_type, kwargs).to_dict()
    with pytest.raises(HeadeditError, match=match):
        HeadGeometry.from_config(config)


def test_zoo_covers_thirty_types_and_the_brief() -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = [f.model_type for f in FAMILIES]
    assert len(types) == len(set(types)) >= 30
    assert set(types) | set(REFUSED) | set(NOT_VERIFIED) <= set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert not set(types) & (set(REFUSED) | set(NOT_VERIFIED))
    assert 6 <= sum(f.fast for f in FAMILIES) <= 10


def test_readme_support_table_is_generated() -> None:
    """README's table is exactly what scripts/support_table.py prints from the lists above."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("support_table", root / "scripts" / "support_table.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    expected = script.table(zoo)
    assert script.readme_table((root / "README.md").read_text(encoding="utf-8")) == expected, (
        "README's support table is stale: run `python scripts/support_table.py --write`")
    assert expected.count("| supported") == len(FAMILIES) >= 30
