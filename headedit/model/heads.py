"""Head geometry and head-set text.

Every head slice in headedit goes through `HeadLayout`: the ablation hook and the bake both call
`HeadLayout.columns`, so what is zeroed in memory is exactly what is zeroed on disk.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple

if TYPE_CHECKING:
    import torch

from headedit.errors import HeadSpecError, UnsupportedModelError

# model_type -> module path of each layer's attention output projection.
# Only layouts where o_proj's input is the concatenation of per-query-head outputs
# [head_0 | head_1 | ...], each head_dim wide, belong here.
O_PROJ_TEMPLATES: dict[str, str] = {
    "llama": "model.layers.{layer}.self_attn.o_proj",
    "mistral": "model.layers.{layer}.self_attn.o_proj",
    "qwen2": "model.layers.{layer}.self_attn.o_proj",
    "qwen3": "model.layers.{layer}.self_attn.o_proj",
    "smollm3": "model.layers.{layer}.self_attn.o_proj",
    "gemma": "model.layers.{layer}.self_attn.o_proj",
    "gemma2": "model.layers.{layer}.self_attn.o_proj",
    "olmo2": "model.layers.{layer}.self_attn.o_proj",
}

# Sanity bounds checked before anything is allocated (a hostile config.json must not OOM us).
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096


class Head(NamedTuple):
    """One attention head: layer L, query head H (both 0-based); text form `L.H`."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


@dataclass(frozen=True)
class HeadLayout:
    """Where every attention head of a decoder lives: read from its config, never guessed from weights."""

    model_type: str
    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    o_proj_template: str

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Any) -> "HeadLayout":
        """Build from a transformers config object or a config.json dict."""
        # Multimodal wrappers keep the decoder's numbers under text_config.
        text_cfg = _get(config, "text_config")
        if text_cfg is not None and _get(config, "num_attention_heads") is None:
            config = text_cfg
        model_type = str(_get(config, "model_type", "") or "")
        archs = _get(config, "architectures") or []
        architecture = str(archs[0]) if archs else (model_type or "unknown")
        template = O_PROJ_TEMPLATES.get(model_type)
        if template is None:
            raise UnsupportedModelError(
                f"unsupported architecture {architecture} (model_type {model_type!r}): "
                "headedit needs a separate self_attn.o_proj in every decoder layer",
                "supported model types: " + ", ".join(sorted(O_PROJ_TEMPLATES)),
            )
        try:
            num_layers = int(_get(config, "num_hidden_layers"))
            num_heads = int(_get(config, "num_attention_heads"))
            num_kv_heads = int(_get(config, "num_key_value_heads") or num_heads)
            hidden_size = int(_get(config, "hidden_size"))
        except (TypeError, ValueError):
            raise UnsupportedModelError(
                f"config of {architecture} lacks num_hidden_layers/num_attention_heads/hidden_size",
                "check config.json",
            ) from None
        head_dim = _get(config, "head_dim")
        head_dim = int(head_dim) if head_dim else (hidden_size // num_heads if num_heads else 0)
        for name, value, bound in (
            ("num_hidden_layers", num_layers, MAX_LAYERS),
            ("num_attention_heads", num_heads, MAX_HEADS),
            ("num_key_value_heads", num_kv_heads, MAX_HEADS),
            ("head_dim", head_dim, MAX_HEAD_DIM),
        ):
            if not 1 <= value <= bound:
                raise UnsupportedModelError(
                    f"config.json has {name}={value}, outside 1..{bound}",
                    "the config is corrupt or hostile; check the model files",
                )
        if num_heads % num_kv_heads:
            raise UnsupportedModelError(
                f"config.json has {num_heads} query heads not divisible by {num_kv_heads} KV heads",
                "check config.json",
            )
        return cls(model_type, architecture, num_layers, num_heads, num_kv_heads, head_dim, hidden_size, template)

    @classmethod
    def from_model(cls, model: Any) -> "HeadLayout":
        """Build from a loaded model and check every o_proj has the width the config promises."""
        layout = cls.from_config(model.config)
        for layer in range(layout.num_layers):
            try:
                module = model.get_submodule(layout.o_proj_path(layer))
            except AttributeError:
                raise UnsupportedModelError(
                    f"{layout.architecture} has no module {layout.o_proj_path(layer)}",
                    "headedit supports decoders with a separate self_attn.o_proj per layer",
                ) from None
            in_features = getattr(module, "in_features", None)
            if in_features != layout.o_proj_in_features:
                raise UnsupportedModelError(
                    f"{layout.o_proj_path(layer)} takes {in_features} inputs, expected "
                    f"{layout.num_heads} heads x {layout.head_dim} = {layout.o_proj_in_features}",
                    "the config does not match the weights",
                )
        return layout

    # ---- geometry -----------------------------------------------------------------------
    @property
    def o_proj_in_features(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def total_heads(self) -> int:
        return self.num_layers * self.num_heads

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA); ablation is per query head, so this is informational."""
        return self.num_heads // self.num_kv_heads

    def o_proj_path(self, layer: int) -> str:
        return self.o_proj_template.format(layer=layer)

    def o_proj_weight_key(self, layer: int) -> str:
        return self.o_proj_path(layer) + ".weight"

    def check(self, head: Head) -> Head:
        if not 0 <= head.layer < self.num_layers:
            raise HeadSpecError(
                f"head {head} is outside the model: layer {head.layer} not in 0..{self.num_layers - 1}",
                f"{self.architecture} has {self.num_layers} layers x {self.num_heads} heads",
            )
        if not 0 <= head.head < self.num_heads:
            raise HeadSpecError(
                f"head {head} is outside the model: head {head.head} not in 0..{self.num_heads - 1}",
                f"{self.architecture} has {self.num_layers} layers x {self.num_heads} heads",
            )
        return head

    def columns(self, head: int) -> slice:
        """The o_proj input columns of query head `head`: [H*d, (H+1)*d)."""
        return slice(head * self.head_dim, (head + 1) * self.head_dim)

    def column_mask(self, head_mask: "torch.Tensor") -> "torch.Tensor":
        """Expand a per-head mask to o_proj input columns, in the same order as `columns`."""
        # [..., head] -> [..., head * d_head]
        return head_mask.repeat_interleave(self.head_dim, dim=-1)

    def all_heads(self) -> list[Head]:
        return [Head(layer, head) for layer in range(self.num_layers) for head in range(self.num_heads)]

    def by_layer(self, heads: Iterable[Head]) -> dict[int, list[int]]:
        """Group heads per layer, each checked against the model."""
        grouped: dict[int, list[int]] = {}
        for h in heads:
            self.check(h)
            grouped.setdefault(h.layer, []).append(h.head)
        return {layer: sorted(set(hs)) for layer, hs in sorted(grouped.items())}

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
        }


# ---- head-set text ------------------------------------------------------------------------
_ITEM = re.compile(r"^(\d+)\.(\*|\d+(?:-\d+)?)$")


def parse_heads(text: str, layout: HeadLayout | None = None) -> tuple[Head, ...]:
    """Parse `"3.1,5.7"`, `"4.*"` (whole layer) and `"2.0-3"` (range) into sorted, unique heads.

    `L.*` needs a layout to know the layer's width; with a layout every head is range-checked.
    The empty string is the empty set (the intact model).
    """
    if not isinstance(text, str):
        raise HeadSpecError(f"head set must be text, got {type(text).__name__}", 'write e.g. "3.1,5.7"')
    heads: set[Head] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            if text.strip():
                raise HeadSpecError(f"malformed head set {text!r}: empty item", 'write e.g. "3.1,5.7"')
            continue
        m = _ITEM.match(item)
        if not m:
            raise HeadSpecError(
                f"malformed head {item!r} in {text!r}",
                'write LAYER.HEAD, LAYER.* or LAYER.FIRST-LAST, comma-separated, e.g. "3.1,5.7,4.*,2.0-3"',
            )
        layer, spec = int(m.group(1)), m.group(2)
        if spec == "*":
            if layout is None:
                raise HeadSpecError(f"{item!r} needs the model's layout to expand", "name the model too")
            if not 0 <= layer < layout.num_layers:
                layout.check(Head(layer, 0))
            heads.update(Head(layer, h) for h in range(layout.num_heads))
        elif "-" in spec:
            lo, hi = (int(x) for x in spec.split("-"))
            if hi < lo:
                raise HeadSpecError(f"empty range {item!r}", "write the lower head first, e.g. 2.0-3")
            heads.update(Head(layer, h) for h in range(lo, hi + 1))
        else:
            heads.add(Head(layer, int(spec)))
    if layout is not None:
        for h in heads:
            layout.check(h)
    return tuple(sorted(heads))


def format_heads(heads: Iterable[Head | tuple[int, int]]) -> str:
    """Canonical text of a head set: sorted, unique, `L.H` comma-separated (parse_heads inverts it)."""
    return ",".join(str(Head(*h)) for h in sorted(set(Head(*h) for h in heads)))


def canonical_heads(text: str, layout: HeadLayout | None = None) -> str:
    """Round-trip text through the parser: the one spelling used as a key in journals and manifests."""
    return format_heads(parse_heads(text, layout))
