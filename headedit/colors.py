"""The one colour scale for head effects (CLI table, TUI heatmap, PNG): green = ablating the head helps,
red = it hurts, grey = no change; diverging and symmetric around 0, in accuracy points.

The scale is stepped, not continuous: LEVELS steps per side, square-root spaced (a +3 point head next to a
+95 point head still gets its own colour), every step an exact xterm-256 cube colour, so a 256-colour
terminal shows exactly these colours and never merges neighbouring steps into one grey. No UI imports.

Use: vmax = scale_max(all deltas); a cell is delta_rgb(points, vmax) with ink_rgb(that) for its text. A colour
bar is legend_stops(vmax): (low, high, rgb) per step from -vmax to +vmax, e.g. for matplotlib
ListedColormap([[c / 255 for c in rgb] for _, _, rgb in stops]) with BoundaryNorm([lo for lo, _, _ in stops] +
[vmax], len(stops)).
"""
from __future__ import annotations

import math
from collections.abc import Iterable

RGB = tuple[int, int, int]

LEVELS = 5  # steps per side
ZERO = 0.05  # |points| below this prints as 0.0 and is coloured as no change
MIN_VMAX = 2.0  # a scale never spans less than ±2 points, so noise is not painted at full strength
NEUTRAL: RGB = (88, 88, 88)  # xterm 240
HELPS: tuple[RGB, ...] = ((95, 135, 95), (95, 175, 95), (0, 175, 0), (0, 215, 0), (0, 255, 0))  # 65 71 34 40 46
HURTS: tuple[RGB, ...] = ((135, 95, 95), (175, 95, 95), (175, 0, 0), (215, 0, 0), (255, 0, 0))  # 95 131 124 160 196


def scale_max(values: Iterable[float | None]) -> float:
    """The symmetric scale for a set of deltas: the largest |finite value|, at least MIN_VMAX points."""
    return max([MIN_VMAX, *(abs(float(v)) for v in values if v is not None and math.isfinite(float(v)))])


def level(points: float, vmax: float) -> int:
    """Signed step in -LEVELS..LEVELS: 0 for no change, ±1 for the smallest visible effect."""
    if not math.isfinite(points) or abs(points) < ZERO:
        return 0
    vmax = max(vmax, MIN_VMAX) if math.isfinite(vmax) else MIN_VMAX
    step = min(LEVELS, 1 + math.floor(LEVELS * math.sqrt(min(1.0, abs(points) / vmax))))
    return step if points > 0 else -step


def level_rgb(step: int) -> RGB:
    if step == 0:
        return NEUTRAL
    return (HELPS if step > 0 else HURTS)[min(abs(step), LEVELS) - 1]


def delta_rgb(points: float, vmax: float) -> RGB:
    """Colour of a head whose ablation changes accuracy by `points`, on a ±`vmax` scale (see `scale_max`)."""
    return level_rgb(level(points, vmax))


def ink_rgb(background: RGB) -> RGB:
    """Black or white, whichever reads better on `background` (WCAG relative luminance)."""

    def channel(c: int) -> float:
        x = c / 255
        return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in background)
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return (0, 0, 0) if luminance > 0.179 else (255, 255, 255)


def boundaries(vmax: float) -> list[float]:
    """Upper edges (points) of the positive steps 1..LEVELS; the negative side mirrors them."""
    vmax = max(vmax, MIN_VMAX)
    return [vmax * (k / LEVELS) ** 2 for k in range(1, LEVELS)] + [vmax]


def legend_stops(vmax: float) -> list[tuple[float, float, RGB]]:
    """(low, high, colour) for every step from -vmax to +vmax in points, for a legend or a colour bar.

    The neutral step spans (-ZERO, ZERO); step k covers |points| in [edge(k-1), edge(k)) with edge(0) = ZERO.
    """
    edges = [ZERO, *boundaries(vmax)]
    positive = [(edges[k], edges[k + 1], HELPS[k]) for k in range(LEVELS)]
    negative = [(-high, -low, HURTS[k]) for k, (low, high, _) in enumerate(positive)]
    return list(reversed(negative)) + [(-ZERO, ZERO, NEUTRAL)] + positive
