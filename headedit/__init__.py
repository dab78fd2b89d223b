"""headedit: model editing by attention-head ablation.

Public API; importing it never imports the terminal UI (textual).
"""
from __future__ import annotations

__version__ = "0.1.0"

from headedit.errors import HeadeditError
from headedit.model.heads import Head, HeadLayout, canonical_heads, format_heads, parse_heads

_LAZY = {"HeadAblation", "ablate", "heads_to_mask"}  # need torch: imported on first use, so the CLI starts fast


def __getattr__(name: str):
    if name in _LAZY:
        from headedit.model import ablation

        return getattr(ablation, name)
    raise AttributeError(f"module 'headedit' has no attribute {name!r}")

__all__ = [
    "__version__", "HeadeditError", "Head", "HeadLayout", "parse_heads", "format_heads", "canonical_heads",
    "HeadAblation", "ablate", "heads_to_mask",
]
