"""Walking an instantiated decoder (meta device, no weights) for its attention layers and output projections.

What `HeadGeometry` is built from: each decoder layer's softmax self-attention, its output projection (a Linear
whose input columns are heads, or GPT-2's Conv1D whose rows are), query/KV heads and per-head width, and the
layers whose token mixer is not softmax attention (Mamba/SSM, linear attention, short convolutions).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, NamedTuple, Sequence

from headedit.errors import ModelLoadError, UnsupportedModelError

# Sanity bounds checked before anything is instantiated (a hostile config.json must not hang or OOM us).
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_EXPERTS = 65536
_BOUNDED = (  # config keys (and their GPT-2-era aliases) -> allowed range
    (("num_hidden_layers", "n_layer", "num_layers"), 1, MAX_LAYERS),
    (("num_attention_heads", "n_head", "num_heads"), 1, MAX_HEADS),
    (("num_key_value_heads", "num_kv_heads"), 1, MAX_HEADS),
    (("head_dim", "v_head_dim"), 1, MAX_HEAD_DIM),
    (("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 0, MAX_EXPERTS),
)

# Names an attention module gives its output projection, most specific first.
OUT_PROJ_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "wo", "out_lin", "attention_out")
# Child names of cross-attention (to an encoder or to images): not the decoder's own heads.
_CROSS_NAMES = ("encoder_attn", "cross_attn", "crossattention", "cross_attention")
# Class-name parts of token mixers that are not softmax attention, with what to call them in `inspect`.
_NOT_SOFTMAX = (("DeltaNet", "linear attention"), ("LinearAttention", "linear attention"),
                ("Lightning", "linear attention"), ("Mamba", "Mamba/SSM"), ("Mixer", "Mamba/SSM"),
                ("SSM", "Mamba/SSM"), ("RecurrentBlock", "recurrent"), ("Rglru", "recurrent"),
                ("ShortConv", "short convolution"), ("Conv", "short convolution"), ("Retention", "retention"))

class Head(NamedTuple):
    """One attention head: layer L, query head H (both 0-based); text form `L.H`."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"


@dataclass(frozen=True)
class AttentionLayer:
    """One decoder layer as headedit sees it: its output projection and how its input splits into heads."""

    layer: int
    path: str | None  # module path of the attention output projection; None: no softmax heads here
    kind: str  # "linear" (weight [out, in]: a head is a block of columns), "conv1d" ([in, out]: rows), "none"
    num_heads: int  # query heads (0 where there are none)
    num_kv_heads: int
    head_width: int  # per-head slice of the projection's input (v head dim for MLA)
    mixer: str  # class name of the attention (or of what mixes tokens instead)

    @property
    def has_heads(self) -> bool:
        return self.num_heads > 0

    @property
    def in_features(self) -> int:
        return self.num_heads * self.head_width

    def head_range(self, head: int) -> tuple[int, int]:
        """Input-feature indices [start, stop) of query head `head`."""
        return head * self.head_width, (head + 1) * self.head_width


def config_value(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    try:
        return getattr(config, key, default)
    except Exception:  # some configs refuse global reads of per-layer values
        return default


def check_bounds(config: Mapping[str, Any]) -> None:
    """Refuse absurd sizes in a config.json (and its text_config) before anything is instantiated."""
    for cfg in (config, config.get("text_config")):
        if not isinstance(cfg, Mapping):
            continue
        for keys, low, high in _BOUNDED:
            for key in keys:
                value = cfg.get(key)
                if value is None or isinstance(value, bool) or not isinstance(value, int):
                    continue
                if not low <= value <= high:
                    raise UnsupportedModelError(f"config.json has {key}={value}, outside {low}..{high}",
                                                "the config is corrupt or hostile; check the model files")


@lru_cache(maxsize=2)
def meta_model(config_json: str) -> Any:
    """The model transformers' AutoModelForCausalLM builds from this config.json, on the meta device
    (parameters have shapes, no storage)."""
    import torch  # lazy: keeps torch/transformers out of `import headedit`
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PretrainedConfig
    from transformers.utils import logging as hf_logging

    raw = json.loads(config_json)
    decode = getattr(PretrainedConfig, "_decode_special_floats", None)  # {"__float__": "Infinity"} -> inf
    raw = decode(raw) if callable(decode) else raw
    model_type = str(raw.get("model_type") or "")
    archs = raw.get("architectures") or []
    name = str(archs[0]) if archs else (model_type or "unknown")
    if model_type not in CONFIG_MAPPING:
        raise UnsupportedModelError(
            f"unsupported architecture {name} (model_type {model_type!r}): the installed transformers does not "
            "know this model type", "upgrade transformers, or check config.json")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # warnings about a config's token ids are not the user's business here
    try:
        try:
            config = CONFIG_MAPPING[model_type].from_dict(raw)
        except Exception as err:  # strict config validation raises several error types
            raise ModelLoadError(f"transformers rejects config.json of {name}: {_first_line(err)}",
                                 "check config.json") from None
        try:
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(config)
        except ValueError as err:
            if "Unrecognized configuration class" in str(err):
                raise UnsupportedModelError(
                    f"unsupported architecture {name} (model_type {model_type!r}): not a causal language model "
                    "transformers can build", "headedit edits decoder-only language models") from None
            raise ModelLoadError(f"transformers cannot build {name} from config.json: {_first_line(err)}",
                                 "check config.json") from None
        except Exception as err:
            raise ModelLoadError(f"transformers cannot build {name} from config.json: {_first_line(err)}",
                                 "check config.json") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _first_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def text_config_of(config: Any) -> Any:
    """The decoder's config: a multimodal config keeps it under text_config."""
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            return get_text(decoder=True)
        except TypeError:
            return get_text()
    text = config_value(config, "text_config")
    return text if text is not None and config_value(config, "num_attention_heads") is None else config


def decoder_layers(model: Any) -> tuple[str, Any]:
    """(path, ModuleList) of a loaded model's decoder layers, found as the geometry finds them."""
    return _decoder_layers(model, text_config_of(model.config))


def _decoder_layers(model: Any, text_config: Any) -> tuple[str, Any]:
    """(path, ModuleList) of the decoder's layers: the shallowest list as long as num_hidden_layers."""
    import torch

    root = model
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        try:
            decoder = get_decoder()
            root = decoder if isinstance(decoder, torch.nn.Module) else model
        except Exception:  # exotic models raise here: search the whole model
            root = model
    names = {id(m): n for n, m in model.named_modules()}
    want = config_value(text_config, "num_hidden_layers")
    lists = [(names.get(id(m), n), m) for n, m in root.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    matching = [(p, m) for p, m in lists if isinstance(want, int) and len(m) == want] or lists
    if not matching:
        arch = type(model).__name__
        raise UnsupportedModelError(f"unsupported architecture {arch}: no list of decoder layers found",
                                    "headedit edits decoder-only language models")
    depth = min(p.count(".") for p, _ in matching)
    shallowest = [(p, m) for p, m in matching if p.count(".") == depth]
    if len(shallowest) > 1:
        raise UnsupportedModelError(
            f"unsupported architecture {type(model).__name__}: several layer lists could be the decoder "
            f"({', '.join(p for p, _ in shallowest)})", "headedit edits one stack of decoder layers")
    return shallowest[0]


def _is_softmax_attention(name: str, module: Any) -> bool:
    cls = type(module).__name__
    if not ("Attention" in cls or "Attn" in cls):
        return False
    if any(part in cls for part, _ in _NOT_SOFTMAX) or "Cross" in cls:
        return False
    leaf = name.rsplit(".", 1)[-1].lower()
    return leaf not in _CROSS_NAMES and not getattr(module, "is_cross_attention", False)


def describe_mixer(mixer: str) -> str:
    for part, label in _NOT_SOFTMAX:
        if part in mixer:
            return label
    return "no softmax attention"


def _out_projection(module: Any) -> tuple[str, Any] | None:
    import torch

    for name in OUT_PROJ_NAMES:
        child = getattr(module, name, None)
        if isinstance(child, torch.nn.Module):
            return name, child
    return None


def _projection_in_features(proj: Any) -> tuple[str, int] | None:
    """(kind, input width) of an output projection: nn.Linear [out, in] or transformers' Conv1D [in, out]."""
    import torch

    weight = getattr(proj, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    if type(proj).__name__ == "Conv1D" and hasattr(proj, "nf"):
        return "conv1d", int(weight.shape[0])
    if isinstance(proj, torch.nn.Linear) or getattr(proj, "in_features", None) == weight.shape[1]:
        return "linear", int(weight.shape[1])
    return None


def _int_attr(objects: Sequence[Any], names: Sequence[str], layer: int) -> int | None:
    for obj in objects:
        if obj is None:
            continue
        for name in names:
            value = config_value(obj, name)
            if isinstance(value, (list, tuple)) and len(value) > layer:
                value = value[layer]  # per-layer lists in a few configs
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _mixer_name(layer_module: Any) -> str:
    """Class name of what mixes tokens in a layer without softmax attention (for inspect)."""
    for _, child in layer_module.named_modules():
        cls = type(child).__name__
        if any(part in cls for part, _ in _NOT_SOFTMAX) or "Attention" in cls:
            return cls
    return type(layer_module).__name__


def walk(model: Any, text_config: Any) -> list[AttentionLayer]:
    """Every decoder layer of `model` (loaded or meta) with its attention output projection and head split."""
    arch = type(model).__name__
    list_path, layer_list = _decoder_layers(model, text_config)
    seen: dict[int, int] = {}
    layers: list[AttentionLayer] = []
    for index, layer_module in enumerate(layer_list):
        prefix = f"{list_path}.{index}"
        found = [(n, m) for n, m in layer_module.named_modules() if n and _is_softmax_attention(n, m)]
        # nested attention wrappers: keep the ones that own an output projection
        owning = [(n, m) for n, m in found if _out_projection(m) is not None]
        if not found:
            layers.append(AttentionLayer(index, None, "none", 0, 0, 0, _mixer_name(layer_module)))
            continue
        if not owning:
            name, module = found[0]
            children = ", ".join(n for n, _ in module.named_children()) or "none"
            raise UnsupportedModelError(
                f"unsupported architecture {arch}: the attention {prefix}.{name} ({type(module).__name__}) has no "
                f"output projection named {'/'.join(OUT_PROJ_NAMES[:4])} (its children: {children})",
                "headedit needs the projection that takes the concatenated head outputs")
        if len(owning) > 1:
            raise UnsupportedModelError(
                f"unsupported architecture {arch}: layer {index} has several attentions "
                f"({', '.join(f'{prefix}.{n}' for n, _ in owning)})", "headedit edits one attention per layer")
        name, attn = owning[0]
        proj_name, proj = _out_projection(attn)  # type: ignore[misc]
        path = f"{prefix}.{name}.{proj_name}"
        if id(proj) in seen:
            raise UnsupportedModelError(
                f"unsupported architecture {arch}: {path} is the same module as layer {seen[id(proj)]}'s "
                "(attention shared across layers)", "headedit edits heads that belong to one layer")
        seen[id(proj)] = index
        kind_width = _projection_in_features(proj)
        if kind_width is None:
            raise UnsupportedModelError(
                f"unsupported architecture {arch}: {path} is a {type(proj).__name__}, neither a Linear nor a "
                "Conv1D with a 2-D weight", "headedit edits plain projections")
        kind, in_features = kind_width
        sources = (attn, getattr(attn, "config", None), text_config)
        heads = _int_attr(sources, ("num_heads", "num_attention_heads", "n_head", "n_heads", "num_q_heads"), index)
        width = _int_attr((attn,), ("v_head_dim", "head_dim", "head_size", "attention_head_size"), index)
        if width is None:
            width = _int_attr((getattr(attn, "config", None), text_config), ("v_head_dim", "head_dim"), index)
        if heads is None:
            raise UnsupportedModelError(
                f"unsupported architecture {arch}: cannot tell how many query heads {prefix}.{name} "
                f"({type(attn).__name__}) has", "headedit reads num_heads from the attention or its config")
        if width is None and in_features % heads == 0:
            width = in_features // heads
        if width is None or heads * width != in_features:
            raise UnsupportedModelError(
                f"unsupported architecture {arch}: {path} takes {in_features} inputs, not {heads} heads x "
                f"{width} per head ({type(attn).__name__})",
                "headedit needs the projection's input to be the concatenated head outputs")
        if not (1 <= heads <= MAX_HEADS and 1 <= width <= MAX_HEAD_DIM):
            raise UnsupportedModelError(f"{path} has {heads} heads of width {width}, outside 1..{MAX_HEADS} x "
                                        f"1..{MAX_HEAD_DIM}", "the config is corrupt or hostile")
        kv = _int_attr(sources, ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "num_key_value_heads"), index)
        groups = _int_attr((attn,), ("num_key_value_groups",), index)
        if getattr(attn, "multi_query", False):
            kv = 1
        elif groups and heads % groups == 0:
            kv = heads // groups
        layers.append(AttentionLayer(index, path, kind, heads, min(kv or heads, heads), width, type(attn).__name__))
    return layers


__all__ = ["Head", "AttentionLayer", "check_bounds", "meta_model", "text_config_of", "decoder_layers", "walk",
           "describe_mixer", "config_value", "MAX_LAYERS", "MAX_HEADS", "MAX_HEAD_DIM"]
