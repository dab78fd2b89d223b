"""Proof that an edited GGUF is exactly the source with the named columns at +0.0 (run after every GGUF bake)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from headedit.errors import ExportError
from headedit.model.gguf_edit import CHUNK, _gguf, _raw, _row_chunks, read_gguf_summary, zero_columns_plan
from headedit.model.gguf_quants import touched_bytes


def verify_edit(src: Path, dst: Path, columns: Mapping[str, Iterable[tuple[int, int]]]) -> None:
    """Re-read both files and raise ExportError unless dst is exactly src with those columns at +0.0.

    Checks: every source key/value and the tensor infos byte-identical (only `headedit.*` keys may be
    added or changed), untouched bytes identical, and edited tensors' dequantized bits equal to the
    source's with the columns set to +0.0 (so a -0.0 or any drift in a neighbouring column fails).
    """
    gguf = _gguf()
    a, b = read_gguf_summary(Path(src)), read_gguf_summary(Path(dst))
    plan = zero_columns_plan(a, columns)
    with Path(src).open("rb") as fa, Path(dst).open("rb") as fb:
        b_kv = {key: _raw(fb, s, e) for key, s, e in b.kv_spans}
        for key, s, e in a.kv_spans:
            if not key.startswith("headedit.") and b_kv.get(key) != _raw(fa, s, e):
                raise ExportError(f"{dst}: metadata {key} differs from {src}")
        a_keys = {key for key, _, _ in a.kv_spans}
        if extra := [k for k in b_kv if k not in a_keys and not k.startswith("headedit.")]:
            raise ExportError(f"{dst}: unexpected metadata {extra[0]}")
        if _raw(fa, *a.tensor_info_span) != _raw(fb, *b.tensor_info_span) or a.alignment != b.alignment:
            raise ExportError(f"{dst}: tensor infos differ from {src}")
        if a.file_size - a.data_offset != b.file_size - b.data_offset:
            raise ExportError(f"{dst}: data section is {b.file_size - b.data_offset} bytes, "
                              f"{src} has {a.file_size - a.data_offset}")
        fa.seek(a.data_offset)
        fb.seek(b.data_offset)
        pos = 0
        for edit in [*plan.edits, None]:
            end = edit.tensor.offset if edit else a.file_size - a.data_offset
            while pos < end:
                n = min(CHUNK, end - pos)
                if fa.read(n) != fb.read(n):
                    raise ExportError(f"{dst}: bytes outside the edited tensors differ from {src} "
                                      f"(data offset {pos}..{pos + n})")
                pos += n
            if edit is None:
                break
            qtype = gguf.GGMLQuantizationType[edit.tensor.type_name]
            mask = touched_bytes(edit.tensor.type_name, edit.row_bytes, edit.ranges)
            for (first, ra), (_, rb) in zip(_row_chunks(fa, edit), _row_chunks(fb, edit)):
                if not np.array_equal(ra[:, ~mask], rb[:, ~mask]):
                    raise ExportError(f"{dst}: {edit.tensor.name} changed bytes outside the zeroed blocks")
                want = np.array(gguf.quants.dequantize(ra, qtype), dtype=np.float32)
                for start, stop in edit.ranges:
                    want[:, start:stop] = 0.0
                got = np.asarray(gguf.quants.dequantize(rb, qtype), dtype=np.float32)
                if not np.array_equal(want.view(np.uint32), got.view(np.uint32)):
                    row = first + int(np.argmax((want.view(np.uint32) != got.view(np.uint32)).any(axis=1)))
                    raise ExportError(f"{dst}: {edit.tensor.name} ({edit.tensor.type_name}) row {row} does not "
                                      f"decode to the source with columns {list(edit.ranges)} at +0.0")
            pos = edit.tensor.offset + edit.tensor.n_bytes


__all__ = ["verify_edit"]
