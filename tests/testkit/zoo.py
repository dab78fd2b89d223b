"""The model zoo's data and helpers: tiny random models of every decoder family headedit claims, built from
transformers' own config classes (nothing downloaded). tests/test_model_zoo.py checks each end to end,
tests/test_model_geometry.py reuses the builders, and `scripts/support_table.py` prints README's support table
from FAMILIES / REFUSED / NOT_VERIFIED here.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from headedit.model.geometry import HeadGeometry
from headedit.model.heads import Head

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
