"""HeadGeometry in detail: per-layer widths, column ranges for the bakes, hybrids' layers without heads, refusals
that name what was found (before any weight is read), checkpoint key spellings, inspect and plan reading it."""
from __future__ import annotations

import io
import json
from argparse import ArgumentParser
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from testkit.zoo import FAMILIES, build, chosen_heads, logits, tiny_config

from headedit.errors import HeadSpecError, ModelLoadError, UnsupportedModelError
from headedit.export.bake import bake
from headedit.model.ablation import HeadAblation, ablate, heads_to_mask
from headedit.model.checkpoint_keys import map_keys as _map_keys
from headedit.model.checkpoint_keys import renamed_by_transformers as _renamed_by_transformers
from headedit.model.geometry import HeadGeometry
from headedit.model.heads import Head, format_heads, parse_heads

FAMILY = {f.model_type: f for f in FAMILIES}


def geometry_of(model_type: str, **extra) -> HeadGeometry:
    kwargs = {**FAMILY[model_type].kwargs, **extra} if model_type in FAMILY else extra
    return HeadGeometry.from_config(tiny_config(model_type, kwargs).to_dict())


# ---- shape ------------------------------------------------------------------------------------
def test_per_layer_widths_and_column_ranges():
    geo = geometry_of("gemma4_text")  # sliding layers 16 wide, the global (last) layer 32 wide
    widths = [lay.head_width for lay in geo.layers]
    assert widths == [16, 16, 32] and not geo.uniform_heads
    assert geo.head_dim == 16 and geo.attention_width == 4 * (16 + 16 + 32)
    cols = geo.columns([Head(0, 1), Head(0, 2), Head(2, 0), Head(2, 3)])
    assert cols == {0: [(16, 48)], 2: [(0, 32), (96, 128)]}  # adjacent heads merged; each layer its own width
    assert geo.columns(1, 2) == slice(32, 64) and geo.columns(1) == slice(16, 32)
    mask = torch.tensor([[True, False, False, True]])  # [row, head]
    assert geo.column_mask(mask, 2).shape == (1, 128) and geo.column_mask(mask, 0).shape == (1, 64)


def test_mla_width_is_v_head_dim_and_kv_heads_are_recorded():
    geo = geometry_of("deepseek_v3")
    assert {(lay.num_heads, lay.head_width) for lay in geo.layers} == {(4, 12)}  # v_head_dim, not head_dim 16
    assert geo.columns([Head(1, 3)]) == {1: [(36, 48)]}
    assert geometry_of("falcon").num_kv_heads == 1  # multi-query
    assert geometry_of("llama").group_size == 2


def test_round_trip_through_dict_and_uniform():
    geo = geometry_of("lfm2")
    again = HeadGeometry.from_dict(json.loads(json.dumps(geo.to_dict())))
    assert again == geo
    flat = HeadGeometry.uniform("llama", "x", 3, 4, 2, 8, 32)
    assert flat.o_proj_template == "model.layers.{layer}.self_attn.o_proj"
    assert HeadGeometry.from_dict({k: v for k, v in flat.to_dict().items() if k != "layers"}) == flat


# ---- hybrids --------------------------------------------------------------------------------------
def test_layers_without_heads_refuse_heads_naming_where_heads_are():
    geo = geometry_of("lfm2")  # conv, attention, conv
    assert [lay.layer for lay in geo.layers_without_heads] == [0, 2]
    assert geo.total_heads == 4 and geo.all_heads() == [Head(1, h) for h in range(4)]
    with pytest.raises(HeadSpecError, match=r"layer 0, which has no attention heads \(Lfm2ShortConv: short "
                                            r"convolution\).*heads only in layers 1\b"):
        parse_heads("0.1", geo)
    with pytest.raises(HeadSpecError, match=r"head 9 not in 0\.\.3.*layer 1 has 4 heads"):
        parse_heads("1.9", geo)
    assert format_heads(parse_heads("1.*", geo)) == "1.0,1.1,1.2,1.3"
    with pytest.raises(HeadSpecError, match="no attention heads"):
        geo.o_proj_path(2)


def test_ablation_mask_cannot_reach_a_layer_without_heads():
    model = build("lfm2", FAMILY["lfm2"].kwargs)
    geo = HeadGeometry.from_model(model)
    with pytest.raises(HeadSpecError, match="no attention heads"):
        heads_to_mask(geo, [[Head(0, 0)]])
    hooks = HeadAblation(model, geo)
    hooks.attach()
    try:
        assert sum(len(m._forward_pre_hooks) for m in model.modules()) == 1  # only the attention layer is hooked
        bad = torch.zeros(1, 3, 4, dtype=torch.bool)  # [row, layer, head]
        bad[0, 2, 1] = True
        with pytest.raises(HeadSpecError, match="layer 2, which has no attention heads"):
            hooks.set_mask(bad)
    finally:
        hooks.detach()


def test_inspect_reports_layers_without_heads(tmp_path):
    from rich.console import Console

    from headedit.commands.inspect import add_parser, inspect_model, run  # inspect_model: the command's own

    model = build("qwen3_next", FAMILY["qwen3_next"].kwargs)
    model.save_pretrained(tmp_path / "m")
    info = inspect_model(str(tmp_path / "m"))
    assert [(d["layer"], d["mixer"], d["kind"]) for d in info["layers_without_heads"]] == [
        (i, "Qwen3NextGatedDeltaNet", "linear attention") for i in range(3)]
    assert info["layers"][3]["heads"] == 4
    parser = ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["inspect", str(tmp_path / "m")])  # the command's own options and defaults
    out = io.StringIO()
    assert run(args, Console(file=out, width=200)) == 0
    text = out.getvalue()
    assert "0-2 (Qwen3NextGatedDeltaNet: linear attention)" in text
    assert "3: 4x16" in text  # heads per layer shown where layers differ


# ---- refusals ---------------------------------------------------------------------------------------
def test_projection_width_mismatch_names_what_was_found():
    model = build("llama", {})
    model.model.layers[1].self_attn.o_proj = torch.nn.Linear(48, 64)  # 4 heads x 16 expected
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.1\.self_attn\.o_proj takes 48 inputs, not 4 "
                                                    r"heads x 16 per head \(LlamaAttention\)"):
        HeadGeometry.from_model(model)


def test_model_without_heads_refused_before_any_weight_is_read(tmp_path):
    folder = tmp_path / "mamba"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_config("mamba", {}).to_dict()))
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UnsupportedModelError, match="MambaForCausalLM.*no layer has softmax attention heads"):
        bake(folder, "0.0", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hostile_sizes_refused_before_instantiation():
    config = tiny_config("mixtral", {"num_local_experts": 4}).to_dict()
    config["num_local_experts"] = 10**7
    with pytest.raises(UnsupportedModelError, match="num_local_experts=10000000, outside 0..65536"):
        HeadGeometry.from_config(config)
    with pytest.raises(UnsupportedModelError, match="does not know this model type"):
        HeadGeometry.from_config({"model_type": "surely-not-a-model"})


def test_checkpoint_projection_with_wrong_shape_names_it(tmp_path):
    model = build("gpt2", {})
    model.save_pretrained(tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    tensors["transformer.h.1.attn.c_proj.weight"] = tensors["transformer.h.1.attn.c_proj.weight"][:48].clone()
    save_file(tensors, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"transformer\.h\.1\.attn\.c_proj\.weight has shape \[48, 64\] but the "
                                             r"model built from config\.json takes 4 heads x 16 = 64 inputs there "
                                             r"\(rows, Conv1D\)"):
        bake(tmp_path / "m", "1.0", tmp_path / "out")


# ---- checkpoint key spellings ---------------------------------------------------------------------------
def _rename_keys(folder: Path, renames: list[tuple[str, str]]) -> None:
    tensors = load_file(folder / "model.safetensors")
    out = {}
    for key, value in tensors.items():
        for old, new in renames:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    save_file(out, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("model_type, renames", [
    ("gpt2", [("transformer.", "")]),  # the original GPT-2 checkpoints: no base-model prefix
    ("gemma3", [("model.language_model.", "language_model.model."), ("model.vision_tower.", "vision_tower."),
                ("model.multi_modal_projector.", "multi_modal_projector."), ("lm_head.", "language_model.lm_head.")]),
])
def test_checkpoint_key_spellings_bake_exactly(model_type, renames, tmp_path):
    from transformers import AutoModelForCausalLM

    model = build(model_type, FAMILY[model_type].kwargs)
    src = tmp_path / "src"
    model.save_pretrained(src)
    _rename_keys(src, renames)
    geo = HeadGeometry.from_config(json.loads((src / "config.json").read_text()))
    keys = list(load_file(src / "model.safetensors"))
    found = _map_keys(geo, keys)
    assert len(found) == len(geo.attention_layers)
    assert all(found[lay.layer] != geo.o_proj_weight_key(lay.layer) for lay in geo.attention_layers)
    # both ways agree: transformers' own renaming, and prefix-tolerant matching when it is not available
    bare = HeadGeometry(geo.model_type, geo.architecture, geo.hidden_size, geo.layers)
    assert _map_keys(bare, keys) == found
    if model_type == "gemma3":
        assert set(found.values()) <= set(_renamed_by_transformers(geo, keys))
    heads = chosen_heads(geo)
    with ablate(model, geo, heads=heads):
        hooked = logits(model)
    out = bake(src, format_heads(heads), tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    assert torch.equal(logits(reloaded), hooked)


def test_missing_projection_in_weights_is_named(tmp_path):
    model = build("opt", {})
    model.save_pretrained(tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    del tensors["model.decoder.layers.2.self_attn.out_proj.weight"]
    save_file(tensors, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"weights lack model\.decoder\.layers\.2\.self_attn\.out_proj\.weight"):
        bake(tmp_path / "m", "0.0", tmp_path / "out")


# ---- plan --------------------------------------------------------------------------------------------
def test_plan_counts_attention_of_head_layers_only():
    from headedit.plan import model_cost

    hybrid = tiny_config("lfm2", FAMILY["lfm2"].kwargs).to_dict()
    cost = model_cost(hybrid)
    assert cost.layout.attention_width == 4 * 16  # one attention layer of three
    per_token = cost.forward_flops([1.0]) - 2 * cost.matmul_params
    assert per_token == 2 * 64 * 2  # attention FLOPs at length 1: 2 x width x s(s+1)
    llama = tiny_config("llama", {}).to_dict()
    real = sum(p.numel() for p in build("llama", {}).parameters())
    assert model_cost(llama).params == real
