"""The screen's layer x head heatmap as a PNG a person can read: for the model card and the README.

Layer and head axes with labels, a colour bar in points, the one diverging scale of `headedit.colors` (green =
zeroing the head alone raised discovery accuracy, red = lowered it, grey = no change), the ablated heads framed,
the value in each cell when the grid is small enough to read, and a title with the task and n. Drawn with
matplotlib's Agg canvas directly (no pyplot, no global backend switch); matplotlib is imported only here.
The bytes are deterministic for one matplotlib version (no timestamp or software tag in the file).
"""
from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from headedit.colors import boundaries, delta_rgb, ink_rgb, legend_stops, scale_max

ANNOTATE_MAX_CELLS = 24 * 24  # above this many heads the cells are too small for numbers
CELL_INCHES = 0.42
DPI = 110


def _unit(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    return (rgb[0] / 255, rgb[1] / 255, rgb[2] / 255)


def heatmap_figure(
    delta: Sequence[Sequence[float | None]],
    ablated: Iterable[tuple[int, int]] = (),
    *,
    task: str = "",
    n: int | None = None,
    method: str = "single",
    unit: str = "points",
    objective: str = "accuracy",
    complete: Sequence[Sequence[bool]] | None = None,
) -> Any:
    """A matplotlib Figure (Agg canvas attached) of the screen; rows = layers (0 at the top), columns = heads."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    values = np.array([[math.nan if v is None else float(v) for v in row] for row in delta], dtype=np.float64)
    if values.ndim != 2 or values.size == 0:
        raise ValueError("delta must be a non-empty [layers][heads] table")
    layers, heads = values.shape
    vmax = scale_max(v for v in values.ravel().tolist() if math.isfinite(v))
    stops = legend_stops(vmax)  # (low, high, rgb) from -vmax to +vmax
    edges = [stops[0][0]] + [high for _, high, _ in stops]
    cmap = ListedColormap([_unit(rgb) for _, _, rgb in stops]).with_extremes(bad=_unit((255, 255, 255)))
    norm = BoundaryNorm(edges, cmap.N)

    width = min(18.0, max(6.5, 2.6 + heads * CELL_INCHES))
    height = min(14.0, max(3.2, 1.7 + layers * CELL_INCHES))
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    shown = np.clip(np.ma.masked_invalid(values), -vmax, vmax)  # the scale ends at ±vmax
    ax.imshow(shown, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    ax.set_xlabel("head (query head index)")
    ax.set_ylabel("layer")
    step_x = max(1, math.ceil(heads / 32))
    step_y = max(1, math.ceil(layers / 32))
    ax.set_xticks(range(0, heads, step_x))
    ax.set_yticks(range(0, layers, step_y))
    ax.set_xticks([x - 0.5 for x in range(heads + 1)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(layers + 1)], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="minor", length=0)

    if layers * heads <= ANNOTATE_MAX_CELLS:
        size = max(5.0, min(9.0, 60.0 / max(heads, 1)))
        for layer in range(layers):
            for head in range(heads):
                v = values[layer, head]
                if not math.isfinite(v):
                    continue
                stopped = complete is not None and not complete[layer][head]
                bg = delta_rgb(v, vmax)  # the cell's own colour, so the number gets black or white ink
                ax.text(head, layer, f"{v:+.1f}" + ("~" if stopped else ""), ha="center", va="center",
                        fontsize=size, color=_unit(ink_rgb(bg)))
    chosen = sorted({(int(layer), int(head)) for layer, head in ablated
                     if 0 <= int(layer) < layers and 0 <= int(head) < heads})
    for layer, head in chosen:
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.4))
        ax.add_patch(Rectangle((head - 0.42, layer - 0.42), 0.84, 0.84, fill=False, edgecolor="white", linewidth=1.0))

    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, fraction=0.05, pad=0.03)
    bar.set_label(f"change in {objective} ({unit})")
    inner = boundaries(vmax)[:-1]  # step edges; uniform spacing on the bar gives each step the same room
    ticks = [-vmax, *(-e for e in reversed(inner)), 0.0, *inner, vmax]
    bar.set_ticks(ticks)
    bar.set_ticklabels([("0" if t == 0 else f"{t:+.0f}" if abs(t) >= 10 else f"{t:+.1f}") for t in ticks])
    what = f"{task} (n={n})" if n is not None else task
    stopped_any = complete is not None and not all(all(row) for row in complete)
    ax.set_title(f"{method} head screen on {what}: change in {objective} when zeroed alone\n"
                 f"green = zeroing helps, red = hurts; framed = ablated ({len(chosen)} head"
                 f"{'s' if len(chosen) != 1 else ''}){'; ~ = stopped early' if stopped_any else ''}", fontsize=10)
    fig.tight_layout()
    return fig


def render_heatmap_png(delta: Sequence[Sequence[float | None]], ablated: Iterable[tuple[int, int]] = (), **kw: Any) -> bytes:
    """PNG bytes of `heatmap_figure` (same arguments)."""
    fig = heatmap_figure(delta, ablated, **kw)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def write_heatmap_png(path: str | Path, delta: Sequence[Sequence[float | None]],
                      ablated: Iterable[tuple[int, int]] = (), **kw: Any) -> Path:
    """Render and write the heatmap PNG; returns the path."""
    path = Path(path)
    path.write_bytes(render_heatmap_png(delta, ablated, **kw))
    return path


__all__ = ["heatmap_figure", "render_heatmap_png", "write_heatmap_png"]
