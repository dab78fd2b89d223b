"""Run the decoder from layer L with cached hidden states, through public module boundaries only.

The model's own forward still builds the causal mask and rotary embeddings (so nothing here depends on
`create_causal_mask` or layer keyword arguments, which move between transformers versions): the layers below L
are swapped for pass-through modules for the duration of one call, and a forward pre-hook on layer L replaces
its input with the cached intact hidden states. The one assumption, that a decoder layer's first input and its
return value are the hidden states tensor (transformers >= 5), is checked by `tests/test_engine_prefix.py`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, cast

import torch

from headedit.model.heads import HeadLayout
from headedit.model.walk import decoder_layers


class _PassThrough(torch.nn.Module):
    """Stands in for a skipped decoder layer: returns its hidden-states input unchanged."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class _GatheredMLP(torch.nn.Module):
    """Stands in for the last layer's MLP: runs it only at the (row, position) pairs whose logits are read.

    A dense MLP acts on each token alone, and after the last layer nothing mixes positions, so every other
    position's final state is never used: their MLP output is left at zero.
    """

    def __init__(self, mlp: torch.nn.Module, rows: torch.Tensor, positions: torch.Tensor) -> None:
        super().__init__()
        self.mlp, self.rows, self.positions = mlp, rows, positions

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        picked = x[self.rows, self.positions].unsqueeze(0)  # [1, n, hidden]
        out = x.new_zeros(x.shape)  # [batch, pos, hidden]
        out[self.rows, self.positions] = self.mlp(picked, *args, **kwargs)[0]
        return out


def prefix_ok(model: Any, layout: HeadLayout) -> bool:
    """Whether this module's layer surgery applies: the decoder's `layers` are the geometry's layer list, every
    layer has heads (SSM / linear-attention layers are not skipped), and each holds its attention as a direct
    child owning the `o_proj` Linear the geometry names. Other families run every forward whole (the engine's
    plain path: same results, no prefix reuse)."""
    _, layers, _ = decoder_parts(model)
    if len(layers) != layout.num_layers:
        return False
    names = {id(m): n for n, m in model.named_modules()}
    for lay in layout.layers:
        found = attention_of(layers[lay.layer]) if lay.has_heads else None
        if found is None or names.get(id(found[1].o_proj)) != lay.path:
            return False
    return True


def gathered_mlp_ok(model: Any) -> bool:
    """Whether the last layer's MLP may be restricted to read positions: a dense per-token `mlp` (no experts)."""
    cfg = model.config
    if any(getattr(cfg, k, None) for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")):
        return False
    _, layers, _ = decoder_parts(model)
    return isinstance(getattr(layers[-1], "mlp", None), torch.nn.Module)


class _Stop(Exception):
    """Raised by a capture hook once every requested layer input is recorded: the rest is not needed."""


def decoder_parts(model: Any) -> tuple[Any, torch.nn.ModuleList, Any]:
    """(base decoder, its layer list, lm_head) of a causal LM (the list where the geometry finds it: `h`, ...)."""
    base = model.get_decoder()
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):  # the geometry's list (`transformer.h`, ...) and its owner
        path, layers = decoder_layers(model)
        base = model.get_submodule(path.rsplit(".", 1)[0]) if "." in path else model
    return base, layers, model.get_output_embeddings()


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def attention_of(layer: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    """(attribute name, module) of a decoder layer's attention: the child that owns an `o_proj` Linear."""
    for name, child in layer.named_children():
        if isinstance(getattr(child, "o_proj", None), torch.nn.Linear):
            return name, child
    return None


class _CachedAttention(torch.nn.Module):
    """Stands in for the attention of the first layer a forward runs: everything up to o_proj's input is the
    same as in the forward the input `z` was captured from (same layer input, no ablation below o_proj), so
    only o_proj runs; the ablation hook on o_proj zeroes this forward's heads as usual."""

    def __init__(self, o_proj: torch.nn.Module, z: torch.Tensor) -> None:
        super().__init__()
        self.o_proj, self.z = o_proj, z

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return self.o_proj(self.z), None


def run_decoder(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    start_layer: int = 0,
    hidden_in: torch.Tensor | None = None,
    capture: Iterable[int] = (),
    only_capture: bool = False,
    read_at: tuple[torch.Tensor, torch.Tensor] | None = None,
    capture_attn: Iterable[int] = (),
    attn_in: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, dict[Any, torch.Tensor]]:
    """Final-normed hidden states [batch, pos, hidden], and the inputs of the `capture` layers.

    `start_layer > 0` needs `hidden_in` [batch, pos, hidden], the states entering that layer for these exact
    inputs. `only_capture` stops the forward as soon as the last capture is recorded.
    `read_at` = (rows, positions): only those final states are read, so the last layer's MLP runs there only
    (callers check `gathered_mlp_ok` first); every other final state is then meaningless.
    `capture_attn`: also record o_proj's input at those layers (key ("attn", layer)); `attn_in` [batch, pos,
    heads * d_head]: such a record for the start layer, so its attention runs o_proj only (`_CachedAttention`).
    """
    base, layers, _ = decoder_parts(model)
    capture = sorted(set(capture))
    capture_attn = sorted(set(capture_attn))
    captured: dict[Any, torch.Tensor] = {}
    handles = []
    last_mlp = None
    swapped_attn: tuple[str, torch.nn.Module] | None = None
    saved: dict[int, torch.nn.Module] = {}
    events = [(L, 0) for L in capture] + [(L, 1) for L in capture_attn]  # forward order: layer input, then o_proj
    last = max(events) if events else None

    def capture_hook(layer: int):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            captured[layer] = _hidden_arg(args, kwargs).detach()
            if only_capture and last == (layer, 0):
                raise _Stop

        return hook

    def attn_hook(layer: int):
        def hook(module: torch.nn.Module, args: tuple) -> None:
            captured[("attn", layer)] = args[0].detach()
            if only_capture and last == (layer, 1):
                raise _Stop

        return hook

    def substitute(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (hidden_in,) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden_in}

    try:
        if start_layer > 0:
            if hidden_in is None:
                raise ValueError("start_layer > 0 needs hidden_in")
            for i in range(start_layer):
                saved[i] = layers[i]
                layers[i] = _PassThrough()
            handles.append(layers[start_layer].register_forward_pre_hook(substitute, with_kwargs=True))
        for layer in capture:
            if layer < start_layer:
                raise ValueError(f"cannot capture layer {layer} below start layer {start_layer}")
            handles.append(layers[layer].register_forward_pre_hook(capture_hook(layer), with_kwargs=True))
        for layer in capture_attn:
            found = attention_of(layers[layer])
            if found is None or (layer == start_layer and attn_in is not None):
                raise ValueError(f"cannot capture the attention of layer {layer}")
            o_proj = cast(torch.nn.Module, found[1].o_proj)  # Module.__getattr__ is typed Tensor | Module
            handles.append(o_proj.register_forward_pre_hook(attn_hook(layer)))
        if attn_in is not None:
            found = attention_of(layers[start_layer])
            if found is None:
                raise ValueError(f"layer {start_layer} has no attention with an o_proj")
            swapped_attn = found
            setattr(layers[start_layer], found[0], _CachedAttention(cast(torch.nn.Module, found[1].o_proj), attn_in))
        if read_at is not None and not only_capture:
            last_mlp = cast(torch.nn.Module, layers[-1].mlp)
            layers[-1].mlp = _GatheredMLP(last_mlp, *read_at)
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        try:
            out = base(**kwargs)
        except _Stop:
            return None, captured
        return out.last_hidden_state, captured
    finally:
        for handle in handles:
            handle.remove()
        for i, module in saved.items():
            layers[i] = module
        if swapped_attn is not None:
            setattr(layers[start_layer], *swapped_attn)
        if last_mlp is not None:
            layers[-1].mlp = last_mlp


def logits_at(model: Any, hidden: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """lm_head logits [n, vocab] (float32) at the given (row, position) pairs only: no full-vocab pass elsewhere."""
    _, _, head = decoder_parts(model)
    picked = hidden[rows, positions]  # [n, hidden]
    logits = head(picked)  # [n, vocab]
    # what some families' ForCausalLM.forward does after lm_head (in the model's dtype, as they do)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(model, "logit_scale", None) is not None:  # Cohere
        logits = logits * model.logit_scale
    if getattr(config, "logits_scaling", None):  # Granite
        logits = logits / config.logits_scaling
    multiplier = getattr(getattr(model, "model", None), "lm_head_multiplier", None)  # Falcon-H1
    if multiplier is not None and not isinstance(multiplier, torch.nn.Module):
        logits = logits * multiplier
    logits = logits.float()
    cap = getattr(config, "final_logit_softcapping", None) or getattr(config, "logits_soft_cap", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


class HiddenCache:
    """LRU of intact hidden states entering a layer, keyed by (batch content, layer), bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> torch.Tensor | None:
        value = self._items.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return value

    def put(self, key: tuple, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if size > self.max_bytes:
            return
        if key in self._items:
            old = self._items.pop(key)
            self._bytes -= old.numel() * old.element_size()
        self._items[key] = value
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, dropped = self._items.popitem(last=False)
            self._bytes -= dropped.numel() * dropped.element_size()

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0
