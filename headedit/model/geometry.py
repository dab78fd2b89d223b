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
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, overload

if TYPE_CHECKING:
    import torch

from headedit.errors import HeadSpecError, ModelLoadError, UnsupportedModelError
from headedit.model.checkpoint_keys import map_keys
from headedit.model.walk import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    AttentionLayer,
    Head,
    check_bounds,
    config_value,
    describe_mixer,
    meta_model,
    text_config_of,
    walk,
)

# The quirks table: model types whose geometry is found but whose output projection cannot be edited this way.
QUIRKS: dict[str, str] = {
    "bitnet": "its o_proj quantizes weight and input per tensor at run time, so zeroed weight columns and zeroed "
              "inputs give different outputs",
}


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
        text_config = text_config_of(config)
        archs = config_value(config, "architectures") or [type(model).__name__]
        model_type = str(config_value(text_config, "model_type", "") or config_value(config, "model_type", ""))
        layers = walk(model, text_config)
        hidden = config_value(text_config, "hidden_size") or config_value(config, "hidden_size") or 0
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
                                f"({lay.mixer}: {describe_mixer(lay.mixer)})", self._where_heads())
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
        found = map_keys(self, list(shapes))
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
            "layers_without_heads": [{"layer": lay.layer, "mixer": lay.mixer, "kind": describe_mixer(lay.mixer)}
                                     for lay in self.layers_without_heads],
            "layers": [{"layer": lay.layer, "o_proj": lay.path, "kind": lay.kind, "heads": lay.num_heads,
                        "kv_heads": lay.num_kv_heads, "head_width": lay.head_width, "mixer": lay.mixer}
                       for lay in self.layers],
        }


# ---- building ---------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _from_config_json(text: str) -> HeadGeometry:
    model = meta_model(text)
    geometry = HeadGeometry.from_model(model)
    return HeadGeometry(geometry.model_type, geometry.architecture, geometry.hidden_size, geometry.layers, text)


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


__all__ = ["HeadGeometry", "Head", "AttentionLayer", "QUIRKS", "MAX_LAYERS", "MAX_HEADS", "MAX_HEAD_DIM"]
