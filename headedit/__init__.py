"""headedit: model editing by attention-head ablation.

Public API; importing it never imports the terminal UI (textual).
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import HeadeditError
from .heads import Head, HeadLayout, canonical_heads, format_heads, parse_heads
from .ablation import HeadAblation, ablate, heads_to_mask

__all__ = [
    "__version__", "HeadeditError", "Head", "HeadLayout", "parse_heads", "format_heads", "canonical_heads",
    "HeadAblation", "ablate", "heads_to_mask",
]
