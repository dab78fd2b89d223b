"""headedit: model editing by attention-head ablation.

Public API: head sets (`parse_heads`, `format_heads`), hook ablation (`ablate`), and the pipeline's stages
`discover`, `validate`, `export` and `evaluate` (each with an optional `progress` callback for the events of
`headedit.events`). Importing it imports neither torch nor the terminal UI (textual); the stages load them.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from headedit.errors import HeadeditError
from headedit.model.heads import Head, HeadLayout, canonical_heads, format_heads, parse_heads

# Imported on first use, so `import headedit` (and the CLI) stays free of torch and textual.
_LAZY = {"HeadAblation": "headedit.model.ablation", "ablate": "headedit.model.ablation",
         "heads_to_mask": "headedit.model.ablation",
         # the Python API: the pipeline's stages with an optional `progress` callback (headedit/api.py)
         "discover": "headedit.api", "validate": "headedit.api", "export": "headedit.api", "evaluate": "headedit.api"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headedit' has no attribute {name!r}")

__all__ = [
    "__version__", "HeadeditError", "Head", "HeadLayout", "parse_heads", "format_heads", "canonical_heads",
    "HeadAblation", "ablate", "heads_to_mask", "discover", "validate", "export", "evaluate",
]
