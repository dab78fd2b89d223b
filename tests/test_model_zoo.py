"""The model zoo: tiny random models of every decoder family headedit claims, built from transformers' own
config classes (nothing downloaded), each checked end to end.

For every supported `model_type`: the geometry found on the meta device from config.json equals the one
walked on the loaded model; `inspect` works; the baked, reloaded checkpoint gives exactly the hook-ablated
logits (fp32, eager attention, `torch.equal`); only the named heads' input slices of the projection weight
changed (every other tensor, biases included, byte-identical); and, where the family's attention goes
through transformers' attention interface, zeroing those heads' outputs inside attention gives the same
logits, so the slice is the head. Hybrids refuse heads in their layers without softmax heads. Families that
cannot work are listed with the reason, and their refusal is checked.

`scripts/support_table.py` prints README's support table from FAMILIES / REFUSED / NOT_VERIFIED below.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from headedit.errors import HeadeditError, HeadSpecError
from headedit.export.bake import bake
from headedit.model.ablation import ablate
from headedit.model.geometry import HeadGeometry
from headedit.model.heads import Head, format_heads, parse_heads

# Tiny sizes applied to every config class that has the field (through its attribute_map: n_embd, n_head, ...).
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, head_dim=16, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)
MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           first_k_dense_replace=1, n_group=1, topk_group=1)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
MAX_PARAMS = 5_000_000  # a tiny config that did not take (a renamed field) must not allocate a real model


@dataclass(frozen=True)
class Family:
    """A model type the zoo checks end to end."""

    model_type: str
    exercises: str  # what this family adds (README)
    projection: str  # geometry's o_proj template (checked)
    kwargs: dict[str, Any] = field(default_factory=dict)
    fast: bool = False  # in the unmarked subset
    probe: str = "exact"  # "exact": zeroing heads inside attention == zeroing slices; "n/a": not through the
    # attention interface; "differs": a per-head norm sits between attention and the projection


FAMILIES: tuple[Family, ...] = (
    # -- the unmarked fast subset: one of each kind of geometry --
    Family("gpt2", "Conv1D projection: a head is a block of weight rows", "transformer.h.{layer}.attn.c_proj",
           fast=True),
    Family("deepseek_v3", "MLA: per-head width is v_head_dim (12), not head_dim; MoE", "model.layers.{layer}.self_attn.o_proj",
           MLA, fast=True),
    Family("gpt_oss", "attention sinks, sliding/full alternation, MoE", "model.layers.{layer}.self_attn.o_proj",
           dict(num_local_experts=4, num_experts_per_tok=2), fast=True),
    Family("lfm2", "hybrid: short-convolution layers have no heads", "model.layers.{layer}.self_attn.out_proj",
           dict(layer_types=["conv", "full_attention", "conv"]), fast=True),
    Family("gemma3", "multimodal: the decoder of text_config is edited", "model.language_model.layers.{layer}.self_attn.o_proj",
           dict(text_config=dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2),
                vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   image_size=32, patch_size=8),
                mm_tokens_per_image=4, image_token_index=127, boi_token_index=125, eoi_token_index=126), fast=True),
    Family("falcon", "multi-query attention, `dense`, parallel attention+MLP", "transformer.h.{layer}.self_attention.dense",
           fast=True),
    Family("opt", "`out_proj` under model.decoder, biases", "model.decoder.layers.{layer}.self_attn.out_proj", fast=True),
    Family("phi", "`dense`, parallel attention+MLP, partial rotary", "model.layers.{layer}.self_attn.dense", fast=True),
    Family("mixtral", "sparse MoE MLP (experts untouched)", "model.layers.{layer}.self_attn.o_proj", dict(num_local_experts=4),
           fast=True),
    # -- the rest of the zoo (slow-marked) --
    Family("llama", "GQA", "model.layers.{layer}.self_attn.o_proj"),
    Family("mistral", "GQA, sliding window", "model.layers.{layer}.self_attn.o_proj"),
    Family("ministral", "GQA, sliding window", "model.layers.{layer}.self_attn.o_proj"),
    Family("qwen2", "q/k/v biases", "model.layers.{layer}.self_attn.o_proj"),
    Family("qwen2_moe", "MoE with shared expert", "model.layers.{layer}.self_attn.o_proj",
           dict(MOE, shared_expert_intermediate_size=32)),
    Family("qwen3", "q/k norms", "model.layers.{layer}.self_attn.o_proj"),
    Family("qwen3_moe", "MoE", "model.layers.{layer}.self_attn.o_proj", MOE),
    Family("qwen3_next", "hybrid: gated DeltaNet (linear attention) layers have no heads; gated attention",
           "model.layers.{layer}.self_attn.o_proj", dict(MOE, num_hidden_layers=4, shared_expert_intermediate_size=32)),
    Family("jamba", "hybrid: Mamba layers have no heads; MoE", "model.layers.{layer}.self_attn.o_proj",
           dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, num_experts=4, expert_layer_period=2,
                expert_layer_offset=1)),
    Family("falcon_h1", "Mamba in parallel with attention in every layer", "model.layers.{layer}.self_attn.o_proj",
           dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8,
                mamba_d_ssm=64)),
    Family("nemotron_h", "hybrid: Mamba-2 layers have no heads; projection under `mixer`",
           "model.layers.{layer}.mixer.o_proj",
           dict(ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=32, n_groups=1, chunk_size=8, n_routed_experts=4,
                moe_intermediate_size=32, moe_shared_expert_intermediate_size=32)),
    Family("minimax", "hybrid: lightning (linear) attention layers have no heads", "model.layers.{layer}.self_attn.o_proj",
           dict(num_local_experts=4)),
    Family("recurrent_gemma", "hybrid: RG-LRU recurrent layers have no heads", "model.layers.{layer}.temporal_block.o_proj"),
    Family("gemma", "head_dim given explicitly", "model.layers.{layer}.self_attn.o_proj"),
    Family("gemma2", "soft-capping, sliding/full alternation", "model.layers.{layer}.self_attn.o_proj"),
    Family("gemma3_text", "sliding/full alternation, q/k norms", "model.layers.{layer}.self_attn.o_proj"),
    Family("gemma4_text", "per-layer head widths (sliding vs global layers)", "model.layers.{layer}.self_attn.o_proj",
           dict(global_head_dim=32, vocab_size_per_layer_input=128, hidden_size_per_layer_input=8)),
    Family("granite", "scaled residuals", "model.layers.{layer}.self_attn.o_proj"),
    Family("granitemoe", "MoE", "model.layers.{layer}.self_attn.o_proj", dict(num_local_experts=4)),
    Family("cohere", "parallel attention+MLP, LayerNorm", "model.layers.{layer}.self_attn.o_proj"),
    Family("cohere2", "sliding/full alternation", "model.layers.{layer}.self_attn.o_proj"),
    Family("starcoder2", "biases everywhere", "model.layers.{layer}.self_attn.o_proj"),
    Family("exaone4", "q/k norms, hybrid sliding window", "model.layers.{layer}.self_attn.o_proj"),
    Family("phi3", "fused qkv_proj", "model.layers.{layer}.self_attn.o_proj"),
    Family("phimoe", "MoE", "model.layers.{layer}.self_attn.o_proj", dict(num_local_experts=4)),
    Family("gpt_neox", "`dense`, fused query_key_value, parallel residual", "gpt_neox.layers.{layer}.attention.dense"),
    Family("gptj", "`out_proj`, parallel attention+MLP, rotary on part of the head", "transformer.h.{layer}.attn.out_proj",
           dict(rotary_dim=8)),
    Family("codegen", "`out_proj`, fused qkv in model-parallel blocks", "transformer.h.{layer}.attn.out_proj",
           dict(rotary_dim=8)),
    Family("bloom", "ALiBi, fused query_key_value", "transformer.h.{layer}.self_attention.dense", probe="n/a"),
    Family("gpt_bigcode", "multi-query attention, Linear `c_proj`", "transformer.h.{layer}.attn.c_proj"),
    Family("openai-gpt", "Conv1D `c_proj`, post-norm", "transformer.h.{layer}.attn.c_proj", probe="n/a"),
    Family("mpt", "ALiBi, `out_proj`", "transformer.blocks.{layer}.attn.out_proj", probe="n/a"),
    Family("olmo", "non-parametric LayerNorm", "model.layers.{layer}.self_attn.o_proj"),
    Family("olmo2", "q/k norms over all heads", "model.layers.{layer}.self_attn.o_proj"),
    Family("olmo3", "sliding/full alternation", "model.layers.{layer}.self_attn.o_proj"),
    Family("olmoe", "MoE", "model.layers.{layer}.self_attn.o_proj", dict(num_experts=4, num_experts_per_tok=2)),
    Family("stablelm", "partial rotary, LayerNorm", "model.layers.{layer}.self_attn.o_proj"),
    Family("smollm3", "layers without rotary (NoPE)", "model.layers.{layer}.self_attn.o_proj"),
    Family("glm", "fused gate_up, partial rotary", "model.layers.{layer}.self_attn.o_proj"),
    Family("glm4", "post-attention norms", "model.layers.{layer}.self_attn.o_proj"),
    Family("deepseek_v2", "MLA", "model.layers.{layer}.self_attn.o_proj", MLA),
    Family("minicpm3", "MLA", "model.layers.{layer}.self_attn.o_proj", MLA),
    Family("persimmon", "`dense`, fused query_key_value, q/k LayerNorm", "model.layers.{layer}.self_attn.dense"),
    Family("nemotron", "LayerNorm1P, partial rotary", "model.layers.{layer}.self_attn.o_proj"),
    Family("helium", "GQA", "model.layers.{layer}.self_attn.o_proj"),
    Family("llama4_text", "chunked attention, MoE", "model.layers.{layer}.self_attn.o_proj", dict(num_local_experts=4)),
    Family("diffllama", "differential attention (a per-head norm after attention)", "model.layers.{layer}.self_attn.o_proj",
           probe="differs"),
    Family("xglm", "`out_proj`, sinusoidal positions", "model.layers.{layer}.self_attn.out_proj", probe="n/a"),
    Family("biogpt", "`out_proj`, learned positions", "biogpt.layers.{layer}.self_attn.out_proj"),
)

# Families headedit refuses, with the reason (README) and what the refusal must say.
REFUSED: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mamba": ("no attention at all (state-space model)", "no layer has softmax attention heads", {}),
    "rwkv": ("RWKV time mixing: no softmax heads, no head-sliced output projection", "no output projection", {}),
    "xlnet": ("relative attention keeps its output projection as a bare parameter", "no output projection", {}),
    "bitnet": ("o_proj quantizes weight and input per tensor at run time: zeroed columns and zeroed inputs differ",
               "quantizes weight and input", {}),
    "deepseek_v4": ("grouped low-rank output projection (o_a_proj/o_b_proj): a head is not one input slice",
                    "no output projection", {}),
    "moshi": ("depth-wise flexible projections (MoshiLinear), not one Linear per layer", "MoshiLinear", {}),
    "prophetnet": ("n-gram self-attention: the projection's input is not heads x head width", "not 4 heads x", {}),
    "hrm_text": ("two stacks of layers (hierarchical reasoning): no single decoder stack", "several layer lists", {}),
    "bert": ("encoder-style block (BertSelfOutput): the projection is outside the attention module", "no output projection",
             {"is_decoder": True}),
}
# Accepted by the geometry, but the zoo cannot establish exactness.
NOT_VERIFIED: dict[str, str] = {
    "zaya": "transformers' own save and reload of a random tiny model already changes its logits",
}

IDS = torch.tensor([[1, 5, 9, 13, 2, 7, 40, 3], [4, 4, 8, 15, 16, 23, 42, 11]])  # [batch, pos]
_PROBE: dict[str, Any] = {"zero": {}, "called": 0}


def tiny_config(model_type: str, kwargs: dict[str, Any]) -> Any:
    """transformers' config class of `model_type` at TINY sizes (plus the family's own kwargs)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    fields = set(getattr(cls, "__dataclass_fields__", {}))
    amap = getattr(cls, "attribute_map", {})
    kw = {amap.get(k, k): v for k, v in TINY.items() if amap.get(k, k) in fields}
    kw.update(kwargs)
    return cls(**kw)


def build(model_type: str, kwargs: dict[str, Any], attn: str = "eager") -> Any:
    """A random tiny fp32 model whose projections and their biases are far from zero (ablation shows)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, kwargs)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    size = sum(p.numel() for p in meta.parameters())
    assert size < MAX_PARAMS, f"{model_type}: tiny config did not take ({size:,} parameters)"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32).eval()
    geometry = HeadGeometry.from_model(model)
    with torch.no_grad():
        for lay in geometry.attention_layers:
            proj = model.get_submodule(lay.path)
            proj.weight.normal_(0, 0.2)
            if getattr(proj, "bias", None) is not None:
                proj.bias.normal_(0, 0.2)
    return model


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def chosen_heads(geometry: HeadGeometry) -> tuple[Head, ...]:
    """Head 1 of the first attention layer, head 0 of the second, the last head of the last."""
    lays = geometry.attention_layers
    heads = {Head(lays[0].layer, 1), Head(lays[-1].layer, lays[-1].num_heads - 1)}
    if len(lays) > 1:
        heads.add(Head(lays[1].layer, 0))
    return tuple(sorted(heads))


def _probe_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """The family's own eager attention, then the chosen heads' outputs zeroed ([batch, pos, head, width])."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    out, weights = eager(module, query, key, value, attention_mask, **kwargs)
    _PROBE["called"] += 1
    heads = _PROBE["zero"].get(id(module))
    if heads:
        out = out.clone()
        out[:, :, heads] = 0
    return out, weights


def _register_probe() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("headedit_probe", _probe_attention)
    AttentionMaskInterface.register("headedit_probe", eager_mask)


def probed_logits(model: Any, geometry: HeadGeometry, heads: tuple[Head, ...]) -> torch.Tensor | None:
    """Logits with `heads` zeroed inside attention, or None when the family does not use the interface."""
    _register_probe()
    model.set_attn_implementation("headedit_probe")
    try:
        _PROBE["zero"], _PROBE["called"] = {}, 0
        for h in heads:
            attention = model.get_submodule(geometry.o_proj_path(h.layer).rsplit(".", 1)[0])
            _PROBE["zero"].setdefault(id(attention), []).append(h.head)
        out = logits(model)
        return out if _PROBE["called"] else None
    finally:
        _PROBE["zero"] = {}
        model.set_attn_implementation("eager")


def check_only_slices_changed(src: Path, out: Path, geometry: HeadGeometry, heads: tuple[Head, ...]) -> int:
    """Every tensor byte-identical except the named heads' slices of the projection weights, which are +0."""
    shapes = {}
    for file in src.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            shapes.update({k: list(f.get_slice(k).get_shape()) for k in f.keys()})
    keys = geometry.match_weights(shapes)
    edits = {keys[layer]: (layer, hs) for layer, hs in geometry.by_layer(heads).items()}
    changed = 0
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), "pt") as a, safe_open(str(out / file.name), "pt") as b:
            assert set(a.keys()) == set(b.keys())
            for key in a.keys():
                x, y = a.get_tensor(key), b.get_tensor(key)
                if key not in edits:
                    assert x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), key
                    continue
                layer, hs = edits[key]
                lay = geometry.layer(layer)
                if lay.kind == "conv1d":  # [in, out]: a head is a block of rows
                    x, y = x.T, y.T
                keep = torch.ones(x.shape[1], dtype=torch.bool)  # [in]
                for h in hs:
                    start, stop = lay.head_range(h)
                    assert torch.equal(y[:, start:stop].view(torch.int32), torch.zeros_like(y[:, start:stop]).view(torch.int32))
                    keep[start:stop] = False
                assert torch.equal(x[:, keep].contiguous().view(torch.uint8), y[:, keep].contiguous().view(torch.uint8))
                changed += 1
    assert changed == len(edits)
    return changed


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
    expected = script.table(sys.modules[__name__])
    assert script.readme_table((root / "README.md").read_text(encoding="utf-8")) == expected, (
        "README's support table is stale: run `python scripts/support_table.py --write`")
    assert expected.count("| supported") == len(FAMILIES) >= 30
