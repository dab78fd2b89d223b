"""Layer x head heatmap of a screen, as a PNG written with zlib alone (no plotting dependency).

Rows are layers (layer 0 at the top), columns are query heads (head 0 at the left). Colour is the
screen's delta in points: orange where zeroing the head raised discovery accuracy, blue where it
lowered it, white for no change; the ablated heads get a black frame. The bytes are deterministic,
so re-rendering an unchanged run gives an identical file (and an identical hash in the manifest).
"""
from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

POSITIVE = np.array([230, 97, 1], dtype=np.float64)  # orange: ablation helps
NEGATIVE = np.array([33, 102, 172], dtype=np.float64)  # blue: ablation hurts
WHITE = np.array([255, 255, 255], dtype=np.float64)
FRAME = np.array([0, 0, 0], dtype=np.uint8)
GRID = np.array([200, 200, 200], dtype=np.uint8)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(rgb: np.ndarray) -> bytes:
    """Encode an [height, width, 3] uint8 array as an 8-bit RGB PNG."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError("encode_png needs a uint8 array of shape [height, width, 3]")
    height, width, _ = rgb.shape
    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), rgb.reshape(height, width * 3)], axis=1)  # [h, 1 + w*3]: filter byte 0 per row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 9)) + _chunk(b"IEND", b"")


def heatmap_rgb(delta: Sequence[Sequence[float]], ablated: Iterable[tuple[int, int]] = (), cell: int | None = None) -> np.ndarray:
    """Pixels of the heatmap: one `cell` x `cell` square per (layer, head), colour scaled to max |delta|."""
    values = np.asarray(delta, dtype=np.float64)
    if values.ndim != 2 or values.size == 0:
        raise ValueError("delta must be a non-empty [layers][heads] table")
    values = np.nan_to_num(values, nan=0.0)
    layers, heads = values.shape
    if cell is None:
        cell = int(max(6, min(24, 768 // max(layers, heads))))
    scale = float(np.abs(values).max()) or 1.0
    t = np.clip(values / scale, -1.0, 1.0)[..., None]  # [layer, head, 1]
    colours = np.where(t >= 0, WHITE + (POSITIVE - WHITE) * t, WHITE + (NEGATIVE - WHITE) * -t)  # [layer, head, 3]
    img = np.repeat(np.repeat(colours.round().astype(np.uint8), cell, axis=0), cell, axis=1)  # [layer*cell, head*cell, 3]
    img[::cell, :, :] = GRID
    img[:, ::cell, :] = GRID
    for layer, head in ablated:
        if 0 <= layer < layers and 0 <= head < heads:
            y, x = layer * cell, head * cell
            frame = max(1, cell // 6)
            img[y:y + cell, x:x + frame] = FRAME
            img[y:y + cell, x + cell - frame:x + cell] = FRAME
            img[y:y + frame, x:x + cell] = FRAME
            img[y + cell - frame:y + cell, x:x + cell] = FRAME
    return img


def write_heatmap_png(path: str | Path, delta: Sequence[Sequence[float]], ablated: Iterable[tuple[int, int]] = (),
                      cell: int | None = None) -> Path:
    """Render and write the heatmap PNG; returns the path."""
    path = Path(path)
    path.write_bytes(encode_png(heatmap_rgb(delta, ablated, cell)))
    return path


def decode_png(data: bytes) -> np.ndarray:
    """Decode a PNG written by `encode_png` (8-bit RGB, filter 0) back to [height, width, 3]; used by tests."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if zlib.crc32(kind + body) & 0xFFFFFFFF != struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]:
            raise ValueError(f"bad CRC in {kind!r} chunk")
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + width * 3)  # [h, filter + w*3]
    if raw[:, 0].any():
        raise ValueError("only filter type 0 is supported")
    return raw[:, 1:].reshape(height, width, 3)  # [h, w, rgb]


__all__ = ["encode_png", "decode_png", "heatmap_rgb", "write_heatmap_png"]
