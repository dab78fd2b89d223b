"""Head geometry: where every attention head of a decoder lives, found by walking the model itself.

One `HeadGeometry` answers every question about heads: the hook ablation, the safetensors bake, the GGUF
bake, the plan's counts and the heatmap's shape all read it, so what is zeroed in memory is exactly what is
zeroed on disk. It is built from the instantiated model (on the meta device when only a config is at hand:
no weight is allocated), not from a table of model types: each decoder layer's softmax self-attention is
found, its output projection (`o_proj`, `dense`, `out_proj`, `c_proj`; a Linear, or GPT-2's transposed
Conv1D whose *rows* are inputs) is read, and its input width must be query heads x per-head width, else the
model is refused naming what was found. Layers without softmax heads (Mamba/SSM, linear attention, short
convolutions of hybrids) are recorded as such; a head can only be named in an attention layer.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple, Sequence, overload

if TYPE_CHECKING:
    import torch

from headedit.errors import HeadSpecError, ModelLoadError, UnsupportedModelError

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

# The quirks table: model types whose geometry is found but whose output projection cannot be edited this way.
QUIRKS: dict[str, str] = {
    "bitnet": "its o_proj quantizes weight and input per tensor at run time, so zeroed weight columns and zeroed "
              "inputs give different outputs",
}


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


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    try:
        return getattr(config, key, default)
    except Exception:  # some configs refuse global reads of per-layer values
        return default


@dataclass(frozen=True)
class HeadGeometry:
    """Every attention layer of a decoder, read from the model (see the module docstring)."""

    model_type: str
    architecture: str
    hidden_size: int
    layers: tuple[AttentionLayer, ...]
    config_json: str = field(default="", compare=False, repr=False)  # what it was built from (maps checkpoint keys)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Any) -> "HeadGeometry":
        """Build from a config.json dict (or a transformers config): the model is instantiated on the meta device."""
        raw = config if isinstance(config, Mapping) else config.to_dict()
        check_bounds(raw)
        text = json.dumps(raw, sort_keys=True, default=str)
        return _from_config_json(text)

    @classmethod
    def from_model(cls, model: Any) -> "HeadGeometry":
        """Build from a loaded (or meta) transformers model by walking its modules."""
        config = model.config
        text_config = _text_config(config)
        archs = _get(config, "architectures") or [type(model).__name__]
        model_type = str(_get(text_config, "model_type", "") or _get(config, "model_type", ""))
        layers = walk(model, text_config)
        hidden = _get(text_config, "hidden_size") or _get(config, "hidden_size") or 0
        geometry = cls(model_type, str(archs[0]), int(hidden), tuple(layers))
        geometry._check_usable()
        return geometry

    @classmethod
    def uniform(cls, model_type: str, architecture: str, num_layers: int, num_heads: int, num_kv_heads: int,
                head_dim: int, hidden_size: int, o_proj: str = "model.layers.{layer}.self_attn.o_proj",
                ) -> "HeadGeometry":
        """Every layer alike (Linear projections at `o_proj` with `{layer}` in it): for grids and synthetic tests."""
        layers = tuple(AttentionLayer(i, o_proj.format(layer=i), "linear", num_heads, num_kv_heads, head_dim, "")
                       for i in range(num_layers))
        return cls(model_type, architecture, hidden_size, layers)

    @classmethod
    def from_dict(cls, info: Mapping[str, Any]) -> "HeadGeometry":
        """Rebuild from `to_dict()` output (inspect --json, a bake manifest)."""
        if isinstance(info.get("layers"), list):
            layers = tuple(AttentionLayer(int(d["layer"]), d.get("o_proj"), str(d.get("kind", "linear")),
                                          int(d.get("heads", 0)), int(d.get("kv_heads", 0)),
                                          int(d.get("head_width", 0)), str(d.get("mixer", "")))
                           for d in info["layers"])
            return cls(str(info.get("model_type", "")), str(info.get("architecture", "")),
                       int(info.get("hidden_size", 0)), layers)
        return cls.uniform(str(info.get("model_type", "")), str(info.get("architecture", "")),
                           int(info["num_layers"]), int(info["num_heads"]), int(info.get("num_kv_heads") or
                                                                                 info["num_heads"]),
                           int(info.get("head_dim") or 1), int(info.get("hidden_size", 0)),
                           str(info.get("o_proj") or "model.layers.{layer}.self_attn.o_proj"))

    def _check_usable(self) -> None:
        quirk = QUIRKS.get(self.model_type)
        if quirk:
            raise UnsupportedModelError(f"unsupported architecture {self.architecture} (model_type "
                                        f"{self.model_type!r}): {quirk}", "headedit cannot bake this family exactly")
        if not self.attention_layers:
            mixers = sorted({lay.mixer for lay in self.layers})
            raise UnsupportedModelError(
                f"unsupported architecture {self.architecture} (model_type {self.model_type!r}): no layer has "
                f"softmax attention heads (found {', '.join(mixers) or 'no layers'})",
                "headedit edits attention heads; this model has none")

    # ---- shape ------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def attention_layers(self) -> tuple[AttentionLayer, ...]:
        return tuple(lay for lay in self.layers if lay.has_heads)

    @property
    def layers_without_heads(self) -> tuple[AttentionLayer, ...]:
        return tuple(lay for lay in self.layers if not lay.has_heads)

    @property
    def num_heads(self) -> int:
        """Query heads of the widest layer: the head axis of masks and heatmaps ([layer, head])."""
        return max((lay.num_heads for lay in self.layers), default=0)

    @property
    def num_kv_heads(self) -> int:
        return max((lay.num_kv_heads for lay in self.layers), default=0)

    @property
    def head_dim(self) -> int:
        """Per-head width, the most common one where layers differ (see `uniform_heads`)."""
        widths = Counter(lay.head_width for lay in self.attention_layers)
        return widths.most_common(1)[0][0] if widths else 0

    @property
    def uniform_heads(self) -> bool:
        """True when every layer has the same heads and width (a plain [layers x heads] grid)."""
        return len({(lay.num_heads, lay.head_width) for lay in self.layers}) == 1

    @property
    def total_heads(self) -> int:
        return sum(lay.num_heads for lay in self.layers)

    @property
    def attention_width(self) -> int:
        """Projection inputs summed over every layer (heads x width): what attention FLOPs scale with."""
        return sum(lay.in_features for lay in self.layers)

    @property
    def o_proj_in_features(self) -> int:
        """Input width of the (most common) output projection."""
        return self.num_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA); ablation is per query head, so this is informational."""
        return self.num_heads // max(1, self.num_kv_heads)

    def layer(self, index: int) -> AttentionLayer:
        return self.layers[index]

    def o_proj_path(self, layer: int) -> str:
        path = self.layers[layer].path
        if path is None:
            raise HeadSpecError(f"layer {layer} has no attention heads ({self.layers[layer].mixer})",
                                self._where_heads())
        return path

    def o_proj_weight_key(self, layer: int) -> str:
        """The model's state-dict name of the projection weight (a checkpoint may spell it differently:
        see `match_weights`)."""
        return self.o_proj_path(layer) + ".weight"

    @property
    def o_proj_template(self) -> str:
        """`...{layer}...` form of the projection paths where they all follow one pattern."""
        templates = {_template(lay.path, lay.layer) for lay in self.attention_layers if lay.path}
        return templates.pop() if len(templates) == 1 else "per layer"

    # ---- heads ------------------------------------------------------------------------
    def _where_heads(self) -> str:
        lays = self.attention_layers
        if len(lays) == len(self.layers):
            return f"{self.architecture} has {self.num_layers} layers x {self.num_heads} heads"
        return f"{self.architecture} has heads only in layers {_ranges([lay.layer for lay in lays])}"

    def check(self, head: Head) -> Head:
        """The head itself, or HeadSpecError naming the layer's range."""
        if not 0 <= head.layer < self.num_layers:
            raise HeadSpecError(
                f"head {head} is outside the model: layer {head.layer} not in 0..{self.num_layers - 1}",
                self._where_heads())
        lay = self.layers[head.layer]
        if not lay.has_heads:
            raise HeadSpecError(f"head {head} names layer {head.layer}, which has no attention heads "
                                f"({lay.mixer}: {_describe(lay.mixer)})", self._where_heads())
        if not 0 <= head.head < lay.num_heads:
            raise HeadSpecError(
                f"head {head} is outside the model: head {head.head} not in 0..{lay.num_heads - 1}",
                f"layer {head.layer} has {lay.num_heads} heads; " + self._where_heads())
        return head

    def heads_in(self, layer: int) -> int:
        return self.layers[layer].num_heads

    def all_heads(self) -> list[Head]:
        return [Head(lay.layer, h) for lay in self.layers for h in range(lay.num_heads)]

    def by_layer(self, heads: Iterable[Head]) -> dict[int, list[int]]:
        """Group heads per layer, each checked against the model."""
        grouped: dict[int, list[int]] = {}
        for h in heads:
            self.check(Head(*h))
            grouped.setdefault(h[0], []).append(h[1])
        return {layer: sorted(set(hs)) for layer, hs in sorted(grouped.items())}

    @overload
    def columns(self, heads: int, layer: int | None = None) -> slice: ...

    @overload
    def columns(self, heads: Iterable[Head | tuple[int, int]], layer: None = None) -> dict[int, list[tuple[int, int]]]: ...

    def columns(self, heads: Any, layer: int | None = None) -> Any:
        """Input-feature index ranges of heads.

        `columns(heads)` with a head set: {layer: [(start, stop), ...]} (sorted, adjacent heads merged), the
        form the bakes use. `columns(h)` / `columns(h, layer)` with one head index: its slice (the layer's
        width; without a layer the common width).
        """
        if isinstance(heads, int):
            width = self.layers[layer].head_width if layer is not None else self.head_dim
            return slice(heads * width, (heads + 1) * width)
        out: dict[int, list[tuple[int, int]]] = {}
        for lay_index, hs in self.by_layer(heads).items():
            lay = self.layers[lay_index]
            ranges: list[tuple[int, int]] = []
            for h in hs:
                start, stop = lay.head_range(h)
                if ranges and ranges[-1][1] == start:
                    ranges[-1] = (ranges[-1][0], stop)
                else:
                    ranges.append((start, stop))
            out[lay_index] = ranges
        return out

    def column_mask(self, head_mask: "torch.Tensor", layer: int | None = None) -> "torch.Tensor":
        """Expand a per-head mask [..., head] to the projection's input columns [..., head * width] of `layer`
        (without a layer: the common width), in the order of `columns`."""
        if layer is None:
            return head_mask.repeat_interleave(self.head_dim, dim=-1)  # [..., head] -> [..., head * d_head]
        lay = self.layers[layer]
        # [..., heads of the widest layer] -> [..., lay.num_heads * lay.head_width]
        return head_mask[..., : lay.num_heads].repeat_interleave(lay.head_width, dim=-1)

    # ---- checkpoints ------------------------------------------------------------------
    def match_weights(self, shapes: Mapping[str, Sequence[int]]) -> dict[int, str]:
        """{layer: checkpoint key of its projection weight}, each checked to have the projection's shape.

        Keys are matched the way transformers loads them (its renamings of legacy checkpoint names), then by
        the module path with checkpoint prefixes such as `model.` / `language_model.` tolerated.
        """
        found = _map_keys(self, list(shapes))
        for lay in self.attention_layers:
            key = found.get(lay.layer)
            if key is None:
                missing = [la.layer for la in self.attention_layers if la.layer not in found]
                raise ModelLoadError(
                    f"weights lack {self.o_proj_weight_key(lay.layer)} (the attention output projection of layer "
                    f"{lay.layer}; {len(missing) - 1} more layers lack theirs)",
                    "the weights do not match the config's architecture")
            shape = [int(d) for d in shapes[key]]
            dim = 1 if lay.kind == "linear" else 0
            if len(shape) != 2 or shape[dim] != lay.in_features:
                raise ModelLoadError(
                    f"{key} has shape {shape} but the model built from config.json takes {lay.num_heads} heads x "
                    f"{lay.head_width} = {lay.in_features} inputs there "
                    f"({'columns' if lay.kind == 'linear' else 'rows, Conv1D'})",
                    "config.json and the weights do not match")
        return found

    # ---- serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "architecture": self.architecture,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "o_proj": self.o_proj_template,
            "layers_without_heads": [{"layer": lay.layer, "mixer": lay.mixer, "kind": _describe(lay.mixer)}
                                     for lay in self.layers_without_heads],
            "layers": [{"layer": lay.layer, "o_proj": lay.path, "kind": lay.kind, "heads": lay.num_heads,
                        "kv_heads": lay.num_kv_heads, "head_width": lay.head_width, "mixer": lay.mixer}
                       for lay in self.layers],
        }


# ---- building ---------------------------------------------------------------------------------
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


@lru_cache(maxsize=8)
def _from_config_json(text: str) -> HeadGeometry:
    model = meta_model(text)
    geometry = HeadGeometry.from_model(model)
    return HeadGeometry(geometry.model_type, geometry.architecture, geometry.hidden_size, geometry.layers, text)


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


def _text_config(config: Any) -> Any:
    """The decoder's config: a multimodal config keeps it under text_config."""
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            return get_text(decoder=True)
        except TypeError:
            return get_text()
    text = _get(config, "text_config")
    return text if text is not None and _get(config, "num_attention_heads") is None else config


def decoder_layers(model: Any) -> tuple[str, Any]:
    """(path, ModuleList) of a loaded model's decoder layers, found as the geometry finds them."""
    return _decoder_layers(model, _text_config(model.config))


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
    want = _get(text_config, "num_hidden_layers")
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


def _describe(mixer: str) -> str:
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
            value = _get(obj, name)
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


# ---- checkpoint keys --------------------------------------------------------------------------
def _map_keys(geometry: HeadGeometry, keys: list[str]) -> dict[int, str]:
    """{layer: checkpoint key} for the projection weights found among `keys`."""
    wanted = {geometry.o_proj_weight_key(lay.layer): lay.layer for lay in geometry.attention_layers}
    found = {wanted[k]: k for k in keys if k in wanted}
    if len(found) == len(wanted):
        return found
    renamed = _renamed_by_transformers(geometry, keys)
    for key, target in renamed.items():
        if target in wanted and wanted[target] not in found:
            found[wanted[target]] = key
    if len(found) == len(wanted):
        return found
    # checkpoint prefixes (base model saved without `model.`, legacy `language_model.model.`): match the
    # shortest unique tail that still holds the layer list and index
    for target, layer in wanted.items():
        if layer in found:
            continue
        parts = target.split(".")
        index = parts.index(str(layer))  # the tail keeps the layer list's name and the layer's index
        for cut in range(1, index):
            tail = ".".join(parts[cut:])
            hits = [k for k in keys if k == tail or k.endswith("." + tail)]
            if len(hits) == 1:
                found[layer] = hits[0]
            if hits:  # found, or ambiguous: a shorter tail would only match more
                break
    return found


def _renamed_by_transformers(geometry: HeadGeometry, keys: list[str]) -> dict[str, str]:
    """{checkpoint key: model parameter name} for keys transformers renames on loading (legacy layouts).

    Uses transformers' own conversion mapping; keys it would assemble from several tensors (converters) are
    left out, so such a projection is reported missing rather than edited wrongly."""
    if not geometry.config_json:
        return {}
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key
    except ImportError:  # another transformers: exact and prefix matching still apply
        return {}
    try:
        model = meta_model(geometry.config_json)
        transforms = get_model_conversion_mapping(model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        state = model.state_dict()
        prefix = model.base_model_prefix
        out: dict[str, str] = {}
        for key in sorted(keys, key=dot_natural_key):
            new, pattern = rename_source_key(key, renamings, converters, prefix, state)
            if new not in state and key in state:
                new, pattern = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=state)
            if pattern is None and new != key:
                out[key] = new
        return out
    except Exception:  # internal API of transformers changed: fall back to exact and prefix matching
        return {}


# ---- text helpers ------------------------------------------------------------------------------
def _template(path: str, layer: int) -> str:
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part == str(layer):
            parts[i] = "{layer}"
            break
    return ".".join(parts)


def _ranges(values: Sequence[int]) -> str:
    """`0-2, 5, 7-9` for sorted integers."""
    out: list[str] = []
    start = prev = None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:  # type: ignore[operator]
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)
