"""Exact head ablation inside a quantized GGUF file, without requantizing or loading it whole.

Zeroing head h of layer L zeroes input columns [h*head_dim, (h+1)*head_dim) of every row of
`blk.L.attn_output.weight`. GGUF stores each row as consecutive quant blocks along that input dimension,
so when a range falls on block (or K-quant sub-block) boundaries the affected blocks can be rewritten to
decode to exactly +0.0 (`gguf_quants`) while every other byte of the data section is copied verbatim.
The header is parsed here with hard bounds instead of `gguf.GGUFReader`, so a truncated or hostile file
fails fast with one line, and so the original key/value and tensor-info bytes can be copied as they are.
"""
from __future__ import annotations

import io
import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import BinaryIO, cast

import numpy as np

from headedit.errors import (
    ExportError,
    HeadSpecError,
    ModelLoadError,
    UnsupportedModelError,
)
from headedit.model.gguf_quants import LAYOUTS, zero_rows

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_STRING = 1 << 24  # bytes in one key, value or name string
MAX_ITEMS = 1 << 28  # key/values, tensors or array elements
MAX_DIMS = 4
CHUNK = 16 << 20  # bytes per streamed read
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_KEY = re.compile(r"[A-Za-z0-9_.\-]+")

Scalar = str | int | float | bool


def _gguf() -> ModuleType:
    try:
        import gguf
    except ImportError as err:
        raise ModelLoadError("reading GGUF files needs the gguf package", hint="pip install gguf") from err
    return gguf


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor as the header describes it; `offset` is relative to the data section."""

    name: str
    type_name: str
    shape: tuple[int, ...]  # torch order: outermost first, so the last entry is GGUF's ne0
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class GgufSummary:
    """Header facts needed to plan an edit; byte spans let the writer copy the header verbatim."""

    path: Path
    version: int
    architecture: str
    block_count: int | None
    head_count: int | None
    head_count_kv: int | None
    embedding_length: int | None
    key_length: int | None
    value_length: int | None
    alignment: int
    metadata: Mapping[str, Scalar]  # scalars and strings; arrays are listed in array_lengths
    array_lengths: Mapping[str, int]
    tensors: tuple[GgufTensorInfo, ...]
    data_offset: int
    file_size: int
    kv_spans: tuple[tuple[str, int, int], ...] = field(repr=False)
    tensor_info_span: tuple[int, int] = field(repr=False)

    def tensor(self, name: str) -> GgufTensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


@dataclass(frozen=True)
class TensorEdit:
    tensor: GgufTensorInfo
    ranges: tuple[tuple[int, int], ...]  # sorted, merged, aligned input-column ranges
    n_rows: int
    row_bytes: int


@dataclass(frozen=True)
class EditPlan:
    """Validated edits, sorted by data offset, ready to stream."""

    summary: GgufSummary
    edits: tuple[TensorEdit, ...]


class _Cursor:
    """Bounded reads from a file: every read past the end is a one-line ModelLoadError, not a crash."""

    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f, self.path, self.size, self.pos = f, path, size, 0

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: {what} (at byte {self.pos})",
                              hint="the GGUF file is truncated or corrupt; download it again")

    def read(self, n: int) -> bytes:
        if n > self.size - self.pos:
            raise self.fail(f"truncated GGUF header: needs {n} more bytes, file has {self.size - self.pos}")
        data = self.f.read(n)
        if len(data) != n:
            raise self.fail("file shrank while reading")
        self.pos += n
        return data

    def unpack(self, fmt: str) -> int:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def count(self, what: str, limit: int = MAX_ITEMS) -> int:
        n = self.unpack("<Q")
        if n > limit:
            raise self.fail(f"{what} {n} exceeds the limit {limit}")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"{what} length", MAX_STRING)
        return self.read(n).decode("utf-8", errors="replace")

    def skip(self, n: int) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"truncated GGUF header: an array needs {n} bytes, file has {self.size - self.pos}")
        self.f.seek(n, io.SEEK_CUR)
        self.pos += n

    def value(self, vtype: int, key: str, depth: int = 0) -> Scalar | int:
        """A scalar or string value, or for an array its element count (the elements are skipped)."""
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string(f"value of {key}")
        if vtype != _ARRAY or depth > 2:
            raise self.fail(f"key {key} has unknown value type {vtype}")
        itype, n = self.unpack("<I"), self.count(f"array {key} length")
        if itype in _SCALARS:
            self.skip(n * struct.calcsize(_SCALARS[itype]))
        elif n * 8 > self.size - self.pos:
            raise self.fail(f"truncated GGUF header: array {key} of {n} items does not fit")
        else:
            for _ in range(n):
                self.value(itype, key, depth + 1)
        return n


def read_gguf_summary(path: Path) -> GgufSummary:
    """Parse only the header (bounded), validating every tensor against the data section's extent."""
    path = Path(path)
    try:
        f = path.open("rb")
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot open: {err.strerror}") from err
    with f:
        size = path.stat().st_size
        cur = _Cursor(f, path, size)
        if size < 24 or cur.read(4) != GGUF_MAGIC:
            raise ModelLoadError(f"{path}: not a GGUF file (no GGUF magic at byte 0)",
                                 hint="pass a .gguf file written by llama.cpp or gguf-py")
        version = cur.unpack("<I")
        if version & 0xFFFF == 0:
            raise ModelLoadError(f"{path}: big-endian GGUF files are not supported")
        if version not in (2, 3):
            raise ModelLoadError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")
        n_tensors, n_kv = cur.count("tensor count"), cur.count("key/value count")
        metadata: dict[str, Scalar] = {}
        arrays: dict[str, int] = {}
        spans: list[tuple[str, int, int]] = []
        for _ in range(n_kv):
            start = cur.pos
            key = cur.string("key")
            if key in metadata or key in arrays:
                raise cur.fail(f"duplicate metadata key {key}")
            vtype = cur.unpack("<I")
            value = cur.value(vtype, key)
            if vtype == _ARRAY:
                arrays[key] = cast(int, value)  # value() gives an array's element count
            else:
                metadata[key] = value
            spans.append((key, start, cur.pos))
        ti_start = cur.pos
        raw_infos = [_tensor_info(cur) for _ in range(n_tensors)]
        ti_end = cur.pos
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelLoadError(f"{path}: general.alignment {alignment!r} is not a power of two")
    data_offset = -(-ti_end // alignment) * alignment
    tensors = _check_tensors(path, raw_infos, alignment, size - data_offset)

    def geom(name: str) -> int | None:
        value = metadata.get(f"{metadata.get('general.architecture')}.{name}")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    heads = geom("attention.head_count")
    return GgufSummary(
        path=path, version=version, architecture=str(metadata.get("general.architecture", "")),
        block_count=geom("block_count"), head_count=heads,
        head_count_kv=geom("attention.head_count_kv") or heads, embedding_length=geom("embedding_length"),
        key_length=geom("attention.key_length"), value_length=geom("attention.value_length"),
        alignment=alignment, metadata=metadata, array_lengths=arrays, tensors=tensors,
        data_offset=data_offset, file_size=size, kv_spans=tuple(spans), tensor_info_span=(ti_start, ti_end),
    )


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string("tensor name")
    n_dims = cur.unpack("<I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
    ne = tuple(cur.count(f"tensor {name} dimension", 1 << 40) for _ in range(n_dims))
    return name, ne, cur.unpack("<I"), cur.unpack("<Q")


def _check_tensors(path: Path, raw: list[tuple[str, tuple[int, ...], int, int]], alignment: int,
                   data_size: int) -> tuple[GgufTensorInfo, ...]:
    gguf = _gguf()
    out: list[GgufTensorInfo] = []
    for name, ne, type_id, offset in raw:
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelLoadError(f"{path}: tensor {name} has unknown ggml type id {type_id}") from None
        n_elems = int(np.prod(ne, dtype=object))
        if ne[0] % block:
            raise ModelLoadError(f"{path}: tensor {name} ({qtype.name}) row of {ne[0]} is not a multiple of {block}")
        n_bytes = n_elems // block * type_size
        if offset % alignment or offset + n_bytes > data_size:
            raise ModelLoadError(
                f"{path}: tensor {name} at data offset {offset} (+{n_bytes} bytes) is misaligned or past the "
                f"end of the file ({data_size} data bytes)", hint="the GGUF file is truncated or corrupt")
        out.append(GgufTensorInfo(name, qtype.name, tuple(reversed(ne)), n_bytes, offset))
    if len({t.name for t in out}) != len(out):
        raise ModelLoadError(f"{path}: duplicate tensor names in the header")
    spans = sorted((t.offset, t.offset + t.n_bytes, t.name) for t in out)
    for (_, end, a), (start, _, b) in pairwise(spans):
        if start < end:
            raise ModelLoadError(f"{path}: tensors {a} and {b} overlap in the data section")
    return tuple(out)


def head_columns(summary: GgufSummary, heads: Iterable[tuple[int, int]]) -> dict[str, list[tuple[int, int]]]:
    """Map (layer, head) pairs to input-column ranges of each layer's `attn_output.weight`."""
    n_heads, layers = summary.head_count, summary.block_count
    head_dim = summary.value_length or summary.key_length
    if head_dim is None and n_heads and summary.embedding_length:
        head_dim = summary.embedding_length // n_heads
    if not (n_heads and layers and head_dim):
        raise UnsupportedModelError(f"{summary.path}: header lacks block_count/head_count/head size for "
                                    f"architecture {summary.architecture!r}")
    columns: dict[str, list[tuple[int, int]]] = {}
    for layer, head in heads:
        if not (0 <= layer < layers and 0 <= head < n_heads):
            raise HeadSpecError(f"head {layer}.{head} is outside {summary.path.name} "
                                f"({layers} layers x {n_heads} heads)")
        name = f"blk.{layer}.attn_output.weight"
        info = summary.tensor(name)
        if info is None or info.shape[-1] != n_heads * head_dim:
            raise UnsupportedModelError(f"{summary.path}: {name} is missing or not {n_heads} heads x {head_dim} wide")
        columns.setdefault(name, []).append((head * head_dim, (head + 1) * head_dim))
    return columns


def zero_columns_plan(summary: GgufSummary, columns: Mapping[str, Iterable[tuple[int, int]]]) -> EditPlan:
    """Check every range can be zeroed exactly in place (type supported, block-aligned); never requantize."""
    edits: list[TensorEdit] = []
    for name, ranges in columns.items():
        info = summary.tensor(name)
        if info is None:
            raise ExportError(f"{summary.path}: no tensor named {name}")
        if info.type_name not in LAYOUTS:
            raise ExportError(f"{name}: type {info.type_name} cannot be zeroed exactly in place "
                              f"(supported: {', '.join(LAYOUTS)})", hint="requantize that tensor first")
        block, type_size, sub = LAYOUTS[info.type_name]
        width = info.shape[-1]
        merged: list[tuple[int, int]] = []
        for start, end in sorted((int(s), int(e)) for s, e in ranges):
            if not 0 <= start < end <= width:
                raise ExportError(f"{name}: column range [{start}, {end}) is empty or outside its "
                                  f"{width} input columns")
            if start % sub or end % sub:
                raise ExportError(f"{name} ({info.type_name}): column range [{start}, {end}) is not aligned to "
                                  f"its {sub}-column blocks; zeroing it would need requantizing")
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        if merged:
            row_bytes = width // block * type_size
            edits.append(TensorEdit(info, tuple(merged), info.n_bytes // row_bytes, row_bytes))
    return EditPlan(summary, tuple(sorted(edits, key=lambda e: e.tensor.offset)))


def _pack_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _new_header(summary: GgufSummary, f: BinaryIO, record: Mapping[str, str]) -> bytes:
    """Source header with `headedit.*` string keys added (same-named keys replaced in place), re-padded."""
    added: dict[str, bytes] = {}
    for key, value in record.items():
        full = key if key.startswith("headedit.") else f"headedit.{key}"
        if not _KEY.fullmatch(full) or not isinstance(value, str):
            raise ExportError(f"record key {key!r} must be [A-Za-z0-9_.-]+ with a string value")
        added[full] = _pack_string(full) + struct.pack("<I", _STRING) + _pack_string(value)

    kv = [added.pop(key) if key in added else _raw(f, start, end) for key, start, end in summary.kv_spans]
    kv += added.values()
    head = _raw(f, 0, 16) + struct.pack("<Q", len(kv)) + b"".join(kv) + _raw(f, *summary.tensor_info_span)
    return head + bytes(-len(head) % summary.alignment)


def _raw(f: BinaryIO, start: int, end: int) -> bytes:
    f.seek(start)
    return f.read(end - start)


def _copy(src: BinaryIO, dst: BinaryIO, n: int) -> None:
    while n > 0:
        data = src.read(min(n, CHUNK))
        if not data:
            raise ExportError(f"{src.name}: file shrank while copying")
        dst.write(data)
        n -= len(data)


def _row_chunks(f: BinaryIO, edit: TensorEdit) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first row, writable uint8 [rows, row_bytes]) chunks of an edited tensor, read in order."""
    step = max(1, CHUNK // edit.row_bytes)
    for first in range(0, edit.n_rows, step):
        n = min(step, edit.n_rows - first)
        buf = bytearray(f.read(n * edit.row_bytes))
        if len(buf) != n * edit.row_bytes:
            raise ExportError(f"{f.name}: file shrank while reading {edit.tensor.name}")
        yield first, np.frombuffer(buf, dtype=np.uint8).reshape(n, edit.row_bytes)


def write_edited_gguf(src: Path, dst: Path, columns: Mapping[str, Iterable[tuple[int, int]]],
                      record: Mapping[str, str]) -> None:
    """Write `dst`: `src` plus `headedit.*` metadata, with the given columns zeroed exactly in place.

    Tensor offsets are relative to the data section, which is re-aligned after the longer header, so the
    tensor infos and every untouched data byte are copied verbatim, streamed in bounded chunks.
    """
    src, dst = Path(src), Path(dst)
    plan = zero_columns_plan(read_gguf_summary(src), columns)
    if dst.exists() and dst.samefile(src):
        raise ExportError(f"{dst}: refusing to overwrite the source GGUF in place")
    summary = plan.summary
    try:
        with src.open("rb") as fin, dst.open("wb") as fout:
            fout.write(_new_header(summary, fin, record))
            fin.seek(summary.data_offset)
            pos = 0
            for edit in plan.edits:
                _copy(fin, fout, edit.tensor.offset - pos)
                for first, rows in _row_chunks(fin, edit):
                    zero_rows(edit.tensor.name, edit.tensor.type_name, rows, edit.ranges, first)
                    fout.write(rows.data)
                pos = edit.tensor.offset + edit.tensor.n_bytes
            _copy(fin, fout, summary.file_size - summary.data_offset - pos)
    except BaseException:
        dst.unlink(missing_ok=True)
        raise
