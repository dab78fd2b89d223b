"""Head-set text: `L.H` items parsed, range-checked against the model's geometry, and spelled canonically.

Where heads live is `headedit.model.geometry.HeadGeometry` (re-exported here as `HeadLayout`, the name the
rest of headedit uses): the ablation hook and the bake both read it, so what is zeroed in memory is exactly
what is zeroed on disk.
"""
from __future__ import annotations

import re
from typing import Iterable

from headedit.errors import HeadSpecError
from headedit.model.geometry import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, AttentionLayer, Head, HeadGeometry

HeadLayout = HeadGeometry  # one geometry object; the old name stays for every caller

__all__ = ["Head", "HeadLayout", "HeadGeometry", "AttentionLayer", "parse_heads", "format_heads", "canonical_heads",
           "MAX_LAYERS", "MAX_HEADS", "MAX_HEAD_DIM"]


# ---- head-set text ------------------------------------------------------------------------
# Numbers are at most 9 digits and a head set's text at most MAX_HEAD_TEXT characters, so parsing is bounded
# before anything is expanded (a 5000-digit number or a range of 10^11 heads is refused, not materialised).
_ITEM = re.compile(r"^(\d{1,9})\.(\*|\d{1,9}(?:-\d{1,9})?)$")
MAX_HEAD_TEXT = 100_000


def parse_heads(text: str, layout: HeadLayout | None = None) -> tuple[Head, ...]:
    """Parse `"3.1,5.7"`, `"4.*"` (whole layer) and `"2.0-3"` (range) into sorted, unique heads.

    `L.*` needs a layout to know the layer's width; with a layout every head is range-checked.
    The empty string is the empty set (the intact model).
    """
    if not isinstance(text, str):
        raise HeadSpecError(f"head set must be text, got {type(text).__name__}", 'write e.g. "3.1,5.7"')
    if len(text) > MAX_HEAD_TEXT:
        raise HeadSpecError(f"head set text is {len(text)} characters long (at most {MAX_HEAD_TEXT})",
                            'use ranges and whole layers, e.g. "2.0-3,4.*"')
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
                f"malformed head {item[:40]!r}{'...' if len(item) > 40 else ''}",
                'write LAYER.HEAD, LAYER.* or LAYER.FIRST-LAST, comma-separated, e.g. "3.1,5.7,4.*,2.0-3"',
            )
        layer, spec = int(m.group(1)), m.group(2)
        if layer >= MAX_LAYERS:
            raise HeadSpecError(f"head {item!r} is outside any model: layer {layer} >= {MAX_LAYERS}",
                                "layers are numbered from 0")
        if spec == "*":
            if layout is None:
                raise HeadSpecError(f"{item!r} needs the model's layout to expand", "name the model too")
            layout.check(Head(layer, 0))  # names the layer's range, or that it has no heads
            heads.update(Head(layer, h) for h in range(layout.heads_in(layer)))
        elif "-" in spec:
            lo, hi = (int(x) for x in spec.split("-"))
            if hi < lo:
                raise HeadSpecError(f"empty range {item!r}", "write the lower head first, e.g. 2.0-3")
            if hi >= MAX_HEADS:  # checked before the range is expanded
                raise HeadSpecError(f"range {item!r} is outside any model: head {hi} >= {MAX_HEADS}",
                                    "heads are numbered from 0 within a layer")
            heads.update(Head(layer, h) for h in range(lo, hi + 1))
        else:
            if int(spec) >= MAX_HEADS:
                raise HeadSpecError(f"head {item!r} is outside any model: head {spec} >= {MAX_HEADS}",
                                    "heads are numbered from 0 within a layer")
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
