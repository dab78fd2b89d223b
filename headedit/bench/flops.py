"""Executed FLOPs of a forward, counted from the shapes that reach each decoder layer (for achieved FLOP/s)."""
from __future__ import annotations

from typing import Any

from headedit.engine.prefix import decoder_parts
from headedit.model.heads import HeadLayout


class FlopCounter:
    """Counts executed matmul + attention FLOPs from the shapes that reach each decoder layer and the LM head."""

    def __init__(self, model: Any, layout: HeadLayout) -> None:
        _, layers, head = decoder_parts(model)
        self.flops = 0.0
        self._handles = []
        attn = 4 * layout.num_heads * layout.head_dim  # QK^T and AV, 2 FLOPs per multiply-add: x positions^2
        for layer in layers:
            params = sum(p.numel() for n, p in layer.named_parameters() if p.dim() == 2)

            def hook(module: Any, args: tuple, kwargs: dict, params: int = params) -> None:
                x = args[0] if args else kwargs["hidden_states"]  # [batch, pos, hidden]
                b, s = int(x.shape[0]), int(x.shape[1])
                self.flops += 2.0 * params * b * s + attn * b * s * s

            self._handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
        out_params = head.weight.numel()

        def head_hook(module: Any, args: tuple) -> None:
            self.flops += 2.0 * out_params * args[0].numel() / args[0].shape[-1]  # rows x hidden x vocab

        self._handles.append(head.register_forward_pre_hook(head_hook))

    def close(self) -> None:
        for h in self._handles:
            h.remove()
