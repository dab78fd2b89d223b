"""Zero column ranges of GGUF tensor rows in place, inside their quantized blocks, never requantizing.

Each supported ggml type gets a rule that makes the affected (sub-)blocks decode to exactly +0.0 while
every other column of the row decodes to the same bits as before. The rules follow the decoders in
ggml-quants.c (mirrored by `gguf.quants`); -0.0 is avoided on purpose, so an edited weight compares
equal *and* has a clear sign bit, which keeps bit-for-bit verification meaningful.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from headedit.errors import ExportError

QK = 32  # elements per block of the legacy formats
QK_K = 256  # elements per K-quant super-block

# type name -> (elements per block, bytes per block, column granularity of a zeroable range)
LAYOUTS: dict[str, tuple[int, int, int]] = {
    "F32": (1, 4, 1), "F16": (1, 2, 1), "BF16": (1, 2, 1),
    "Q4_0": (QK, 18, QK), "Q4_1": (QK, 20, QK), "Q5_0": (QK, 22, QK), "Q5_1": (QK, 24, QK),
    "Q8_0": (QK, 34, QK),
    "Q2_K": (QK_K, 84, 16), "Q3_K": (QK_K, 110, 16), "Q4_K": (QK_K, 144, 32), "Q5_K": (QK_K, 176, 32),
    "Q6_K": (QK_K, 210, 16),
}


def _whole_block(d_zero: int, tail: bytes) -> bytes:
    return bytes(d_zero) + tail


# A legacy block is replaced whole. Q4_0 decodes d*(q-8) and Q5_0 d*(q-16): with d=+0 a quant below the
# offset would give -0.0, so the quant is set to the offset itself (nibbles 8; Q5_0 high bits all 1).
# Q4_1/Q5_1 decode d*q+m and Q8_0 d*q: all-zero bytes give +0*0(+0) = +0.0.
ZERO_BLOCKS: dict[str, bytes] = {
    "Q4_0": _whole_block(2, b"\x88" * 16),
    "Q4_1": bytes(20),
    "Q5_0": _whole_block(2, b"\xff" * 4 + bytes(16)),
    "Q5_1": bytes(24),
    "Q8_0": bytes(34),
}


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 at byte `offset` of every super-block, as float32 (one per row)."""
    return blocks[:, offset:offset + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _set_bits(blocks: np.ndarray, idx: np.ndarray, shift: np.ndarray, width: int, value: np.ndarray | int) -> None:
    """Overwrite `width` bits at `shift` of bytes `idx` in every row; `value` is per row or scalar."""
    mask = (((1 << width) - 1) << shift).astype(np.uint8)
    val = (np.asarray(value, dtype=np.uint8).reshape(-1, 1) << shift).astype(np.uint8)
    blocks[:, idx] = (blocks[:, idx] & ~mask) | val


def _refuse(name: str, type_name: str, rows: np.ndarray, bad: np.ndarray, sb: int, why: str) -> None:
    if bad.any():
        row = int(rows[int(np.argmax(bad))])
        raise ExportError(
            f"{name} ({type_name}): row {row}, super-block {sb}: {why}; "
            "a zero sub-block cannot be expressed as +0.0 there without touching other columns",
            hint="this file was not written by a llama.cpp quantizer; convert that tensor to F16 or Q8_0 first",
        )


def _check_scale(name: str, type_name: str, rows: np.ndarray, blocks: np.ndarray, sb: int, d_off: int,
                 dmin_off: int | None) -> np.ndarray:
    """Return the super-block scale d per row; refuse rows where no scale/quant choice gives +0.0."""
    d = _f16(blocks, d_off)
    _refuse(name, type_name, rows, ~np.isfinite(d), sb, "super-block scale d is not finite")
    if dmin_off is not None:
        dmin = _f16(blocks, dmin_off)
        _refuse(name, type_name, rows, ~np.isfinite(dmin), sb, "super-block min scale dmin is not finite")
        # value = (d*0)*q - dmin*0 = (+-0) - (+-0): -0.0 exactly when d < 0 and dmin >= +0
        _refuse(name, type_name, rows, np.signbit(d) & ~np.signbit(dmin), sb,
                "super-block scale d is negative while dmin is not")
    return d


def _k4_scale_min(j: int) -> list[tuple[int, int, int]]:
    """(byte, shift, width) fields of the 6-bit scale and min of sub-block j in the Q4_K/Q5_K 12-byte table."""
    base = 4
    if j < 4:
        return [(base + j, 0, 6), (base + 4 + j, 0, 6)]
    k = j - 4
    return [(base + 8 + k, 0, 4), (base + k, 6, 2), (base + 8 + k, 4, 4), (base + 4 + k, 6, 2)]


def _zero_q2k(blocks: np.ndarray, j: int, d: np.ndarray) -> None:
    blocks[:, j] = 0  # 4-bit scale and 4-bit min of sub-block j: value = (d*0)*q - dmin*0


def _zero_q4k(blocks: np.ndarray, j: int, d: np.ndarray) -> None:
    for byte, shift, width in _k4_scale_min(j):
        _set_bits(blocks, np.array([byte]), np.array([shift]), width, 0)


def _zero_q3k(blocks: np.ndarray, j: int, d: np.ndarray) -> None:
    # value = d*(s-32) * (ql - 4*(1-h)); s=32 makes the sub-scale +-0 with d's sign, so the quant must be
    # 0 (ql=0, h=1) when d >= +0 and -4 (ql=0, h=0) when d < 0: (-0)*(-4) = +0.0.
    _set_bits(blocks, np.array([96 + j % 8]), np.array([4 * (j // 8)]), 4, 0)
    _set_bits(blocks, np.array([96 + 8 + j % 4]), np.array([2 * (j // 4)]), 2, 2)
    e = 16 * j + np.arange(16)
    _set_bits(blocks, 32 + (e // 128) * 32 + e % 32, 2 * ((e % 128) // 32), 2, 0)
    _set_bits(blocks, e % 32, e // 32, 1, (~np.signbit(d)).astype(np.uint8))


def _zero_q6k(blocks: np.ndarray, j: int, d: np.ndarray) -> None:
    # value = d*sc * (q-32); sc=0 gives +-0 with d's sign, so q=32 when d >= +0 and q=0 when d < 0.
    blocks[:, 192 + j] = 0
    e = 16 * j + np.arange(16)
    _set_bits(blocks, (e // 128) * 64 + e % 64, 4 * ((e % 128) // 64), 4, 0)
    _set_bits(blocks, 128 + (e // 128) * 32 + e % 32, 2 * ((e % 128) // 32), 2,
              np.where(np.signbit(d), 0, 2).astype(np.uint8))


# type -> (sub-block zeroing rule, byte offset of d, byte offset of dmin or None)
K_RULES: dict[str, tuple[Callable[[np.ndarray, int, np.ndarray], None], int, int | None]] = {
    "Q2_K": (_zero_q2k, 80, 82), "Q3_K": (_zero_q3k, 108, None), "Q4_K": (_zero_q4k, 0, 2),
    "Q5_K": (_zero_q4k, 0, 2), "Q6_K": (_zero_q6k, 208, None),
}


def zero_rows(name: str, type_name: str, rows: np.ndarray, ranges: Sequence[tuple[int, int]],
              first_row: int = 0) -> None:
    """Zero columns [start, end) of every row of `rows` (uint8, shape [n_rows, bytes_per_row]) in place.

    Ranges must already be validated against `LAYOUTS[type_name]` granularity; `first_row` only feeds
    error messages so they name the row of the whole tensor.
    """
    block, size, sub = LAYOUTS[type_name]
    n_rows = rows.shape[0]
    row_ids = first_row + np.arange(n_rows)
    if block == 1:
        for start, end in ranges:
            rows[:, start * size:end * size] = 0
        return
    blocks = rows.reshape(n_rows, -1, size)
    if type_name in ZERO_BLOCKS:
        pattern = np.frombuffer(ZERO_BLOCKS[type_name], dtype=np.uint8)
        for start, end in ranges:
            blocks[:, start // block:end // block, :] = pattern
        return
    rule, d_off, dmin_off = K_RULES[type_name]
    subs = sorted({j for start, end in ranges for j in range(start // sub, end // sub)})
    per_sb = block // sub
    for sb in sorted({j // per_sb for j in subs}):
        view = blocks[:, sb, :].copy()
        d = _check_scale(name, type_name, row_ids, view, sb, d_off, dmin_off)
        for j in (j % per_sb for j in subs if j // per_sb == sb):
            rule(view, j, d)
        blocks[:, sb, :] = view


def touched_bytes(type_name: str, row_bytes: int, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    """Per-row byte mask of the blocks (whole super-blocks for K-quants) `zero_rows` may rewrite."""
    block, size, _ = LAYOUTS[type_name]
    mask = np.zeros(row_bytes, dtype=bool)
    for start, end in ranges:
        mask[start // block * size:-(-end // block) * size] = True
    return mask
