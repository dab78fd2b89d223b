"""In-memory head ablation through forward pre-hooks on each layer's attention output projection.

Zeroing the projection's input slice of a head is exactly what the bake does to the weight: for a Linear,
x[:, cols] = 0 then x @ W.T equals x @ W'.T with W'[:, cols] = 0, term by term (for GPT-2's Conv1D, x @ W with
W'[rows, :] = 0), so the two paths give bit-identical logits (tested on every family of the model zoo).
Which module, and which slice per layer, come from the one `HeadGeometry`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from headedit.model.heads import Head, HeadLayout


def heads_to_mask(layout: HeadLayout, head_sets: list[Iterable[Head]], device: Any = None) -> torch.Tensor:
    """One row per ablation set: True where the head is zeroed (head axis as wide as the widest layer)."""
    mask = torch.zeros(len(head_sets), layout.num_layers, layout.num_heads, dtype=torch.bool)  # [set, layer, head]
    for row, heads in enumerate(head_sets):
        for h in heads:
            h = layout.check(Head(*h))
            mask[row, h.layer, h.head] = True
    return mask.to(device) if device is not None else mask


class HeadAblation:
    """Hooks every attention output projection once; what is ablated can change between forwards without re-hooking.

    State is either a head set applied to every row, or a per-row mask [batch, layers, heads]
    (True = zero that head in that row), so one forward evaluates a different set per row.
    """

    def __init__(self, model: torch.nn.Module, layout: HeadLayout) -> None:
        self.model = model
        self.layout = layout
        self._keep_cols: dict[int, torch.Tensor] = {}  # layer -> [rows or 1, 1, in_features] bool
        self._rows: int | None = None
        self._handles: list[Any] = []

    # ---- state --------------------------------------------------------------------------
    def clear(self) -> None:
        self._keep_cols = {}
        self._rows = None

    def set_heads(self, heads: Iterable[Head]) -> None:
        """Ablate the same heads in every row."""
        mask = heads_to_mask(self.layout, [list(heads)])  # [1, layer, head]
        self._set(mask, rows=None)

    def set_mask(self, mask: torch.Tensor | None) -> None:
        """Per-row ablation: mask [batch, layers, heads], True = zeroed. None clears."""
        if mask is None:
            self.clear()
            return
        expected = (self.layout.num_layers, self.layout.num_heads)
        if mask.dim() != 3 or tuple(mask.shape[1:]) != expected:
            raise ValueError(f"ablation mask must be [batch, {expected[0]}, {expected[1]}], got {tuple(mask.shape)}")
        self._set(mask.bool(), rows=int(mask.shape[0]))

    def _set(self, mask: torch.Tensor, rows: int | None) -> None:
        device = self._device()
        keep: dict[int, torch.Tensor] = {}
        for layer in range(self.layout.num_layers):
            layer_mask = mask[:, layer, :]  # [rows, head]
            if not bool(layer_mask.any()):
                continue
            lay = self.layout.layer(layer)
            if bool(layer_mask[:, lay.num_heads:].any()):
                extra = int(layer_mask[:, lay.num_heads:].nonzero()[0, 1]) + lay.num_heads
                self.layout.check(Head(layer, extra))  # raises, naming the layer's heads
            cols = self.layout.column_mask(~layer_mask, layer)  # [rows, heads * width] of this layer
            keep[layer] = to_device(cols.unsqueeze(1), device)  # [rows, 1, heads * width]
        self._keep_cols = keep
        self._rows = rows

    def _device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    # ---- hooks --------------------------------------------------------------------------
    def _hook(self, layer: int):
        def pre_hook(module: torch.nn.Module, args: tuple) -> tuple | None:
            keep = self._keep_cols.get(layer)
            if keep is None:
                return None
            x = args[0]  # [batch, pos, heads * width]
            if self._rows is not None and x.shape[0] != self._rows:
                raise ValueError(f"ablation mask has {self._rows} rows but the batch has {x.shape[0]}")
            if keep.device != x.device:
                keep = keep.to(x.device)
            return (x.masked_fill(~keep, 0),) + tuple(args[1:])

        return pre_hook

    def attach(self) -> None:
        for lay in self.layout.attention_layers:
            layer = lay.layer
            module = self.model.get_submodule(self.layout.o_proj_path(layer))
            self._handles.append(module.register_forward_pre_hook(self._hook(layer)))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.clear()


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host tensor to `device`; to CUDA through pinned memory without blocking the host (the copy is ordered
    on the stream before any kernel that reads it)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


@contextmanager
def ablate(
    model: torch.nn.Module,
    layout: HeadLayout | None = None,
    heads: Iterable[Head] = (),
    mask: torch.Tensor | None = None,
) -> Iterator[HeadAblation]:
    """Zero `heads` (or a per-row `mask`) inside the block; hooks are removed on exit, even on error."""
    layout = layout or HeadLayout.from_model(model)
    ablation = HeadAblation(model, layout)
    ablation.attach()
    try:
        if mask is not None:
            ablation.set_mask(mask)
        else:
            ablation.set_heads(heads)
        yield ablation
    finally:
        ablation.detach()
