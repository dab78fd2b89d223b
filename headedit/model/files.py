"""Read a model folder's own files safely: bounded sizes, regular files only, every field type-checked.

Why a module of its own: config.json, the shard index and safetensors headers come from whoever published the
model. Each is read with a size bound (a FIFO or /dev/zero never hangs or fills memory), parsed without
non-finite numbers, and checked field by field, so a hostile file is one `ModelLoadError` line instead of an
OverflowError, an AttributeError or a huge allocation further down.
"""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from headedit.errors import ModelLoadError

MAX_CONFIG_BYTES = 16 * 2**20
MAX_INDEX_BYTES = 64 * 2**20
MAX_HEADER_BYTES = 100 * 2**20
MAX_VOCAB = 2**22  # 4M tokens; the largest real vocabularies are ~260k
MAX_DIM = 2**20  # hidden/intermediate sizes and positions
# Integer fields of a decoder config (top level or text_config) and their bounds; head geometry is bounded
# more tightly by HeadLayout, so its bound here only keeps the numbers machine-sized.
_INT_FIELDS = {
    "num_hidden_layers": 2**31, "num_attention_heads": 2**31, "num_key_value_heads": 2**31, "head_dim": 2**31,
    "hidden_size": MAX_DIM, "vocab_size": MAX_VOCAB,
}
# Sizes some architectures write as lists: range-checked only when they are integers.
_SIZE_FIELDS = {"intermediate_size": 16 * MAX_DIM, "max_position_embeddings": 2**27}
# Bits per element of every safetensors dtype (sub-byte float formats included).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6,
}


class _NotFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotFinite(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"non-finite number {text}")
    return value


def strict_json(data: bytes | str) -> Any:
    """json.loads without NaN/Infinity (also spelled as 1e999); raises ValueError or RecursionError."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; FIFOs, devices and folders are refused unread."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise ModelLoadError(f"cannot read {what} ({err.strerror or err})", "check the model folder") from None
    if not stat.S_ISREG(info.st_mode):
        raise ModelLoadError(f"{what} is not a regular file", "replace it with the real file")
    if info.st_size > limit:
        raise ModelLoadError(f"{what} is {info.st_size} bytes, more than the {limit} a real one needs",
                             "the file is corrupt or hostile; re-download the model")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as err:
        raise ModelLoadError(f"cannot read {what} ({err.strerror or err})", "check the model folder") from None
    if len(data) > limit:
        raise ModelLoadError(f"{what} grew past {limit} bytes while read", "re-download the model")
    return data


def check_regular_files(path: Path, patterns: list[str]) -> None:
    """Every file transformers may open in the folder is a regular file (a FIFO named tokenizer.json would hang)."""
    for pattern in [*patterns, "*.safetensors"]:
        for file in path.glob(pattern):
            try:
                mode = os.stat(file).st_mode
            except OSError:  # a dangling or looping symlink: the loader reports the file it needs
                continue
            if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                raise ModelLoadError(f"{file.name} in the model folder is not a regular file (a FIFO or device)",
                                     "replace it with the real file")


def _check_int(where: str, key: str, value: Any, bound: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"config.json{where} has {key}={str(value)[:40]!r}, not an integer",
                             "the config is corrupt; re-download the model")
    if not 1 <= value <= bound:
        raise ModelLoadError(f"config.json{where} has {key}={value}, outside 1..{bound}",
                             "the config is corrupt or hostile; check the model files")


def check_config(config: Any, where: str = "") -> dict[str, Any]:
    """Type and range checks of the fields headedit and the loader read before allocating anything."""
    if not isinstance(config, dict):
        raise ModelLoadError(f"config.json{where} is not a JSON object", "re-download the model")
    for key, bound in _INT_FIELDS.items():
        _check_int(where, key, config.get(key), bound)
    for key, bound in _SIZE_FIELDS.items():
        if isinstance(config.get(key), (int, float, str)):
            _check_int(where, key, config[key], bound)
    for key in ("model_type", "torch_dtype", "dtype"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise ModelLoadError(f"config.json{where} has {key} of type {type(config[key]).__name__}, not text",
                                 "re-download the model")
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise ModelLoadError(f"config.json{where} has architectures that is not a list of names",
                             "re-download the model")
    for key in ("auto_map", "rope_scaling", "rope_parameters"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise ModelLoadError(f"config.json{where} has {key} of type {type(config[key]).__name__}, not an object",
                                 "re-download the model")
    text = config.get("text_config")
    if text is not None:
        check_config(text, where=f" (text_config){where}")
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    if isinstance(vocab, int) and isinstance(hidden, int) and vocab * hidden > 2**34:
        raise ModelLoadError(f"config.json{where} has vocab_size {vocab} x hidden_size {hidden}: an absurd embedding",
                             "the config is corrupt or hostile; check the model files")
    return config


def read_config(path: Path) -> dict[str, Any]:
    """config.json of a model folder, bounded and checked field by field."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path.name or path} has no config.json", "point at a transformers model folder")
    data = read_bounded(config_file, MAX_CONFIG_BYTES, "config.json")
    try:
        config = strict_json(data.decode("utf-8"))
    except _NotFinite as err:
        raise ModelLoadError(f"config.json has a {err}", "the config is corrupt; re-download the model") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        detail = f" ({err})" if isinstance(err, json.JSONDecodeError) else ""
        raise ModelLoadError(f"config.json is not valid JSON{detail}", "re-download the model") from None
    return check_config(config)


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def weight_files(path: Path, allow_pickle: bool = False) -> list[Path]:
    """The safetensors files of a checkpoint, in index order; pickle weights are refused."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = strict_json(read_bounded(index, MAX_INDEX_BYTES, index.name).decode("utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
            raise ModelLoadError(f"{index.name} is corrupt", "re-download the model") from None
        if not isinstance(weight_map, dict) or not all(isinstance(k, str) for k in weight_map):
            raise ModelLoadError(f"{index.name} has a weight_map that is not an object of tensor names",
                                 "re-download the model")
        bad = next((v for v in weight_map.values() if not _plain_name(v) or not v.endswith(".safetensors")), None)
        if bad is not None or not weight_map:
            raise ModelLoadError(f"{index.name} names {str(bad)[:60]!r} as a shard (a shard is a .safetensors file "
                                 "in the model folder)", "re-download the model")
        files = [path / name for name in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"shard {missing[0]} named by the index is missing", "re-download the model")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    if list(path.glob("*.bin")) or list(path.glob("*.pt")) or list(path.glob("*.pth")):
        if allow_pickle:
            return []
        raise ModelLoadError(
            f"{path.name} has only pickle weights (.bin), which can run code when loaded",
            "convert it to safetensors (load it once where you trust it, save_pretrained) and point at that folder",
        )
    raise ModelLoadError(f"{path.name} has no model.safetensors", "point at a folder with safetensors weights")


def _tensor_bytes(key: str, info: Any) -> tuple[int, int]:
    """(start, end) of a tensor's data after checking its entry: known dtype, shape of ints, offsets that match."""
    if not isinstance(info, dict):
        raise TypeError(f"entry {key[:60]!r} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise ValueError(f"tensor {key[:60]!r} has unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"tensor {key[:60]!r} has a shape that is not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]):
        raise ValueError(f"tensor {key[:60]!r} has invalid data_offsets")
    count = math.prod(shape)
    if (count * DTYPE_BITS[dtype] + 7) // 8 != offsets[1] - offsets[0]:
        raise ValueError(f"tensor {key[:60]!r} claims shape {shape[:4]} but holds {offsets[1] - offsets[0]} bytes")
    return offsets[0], offsets[1]


def safetensors_header(file: Path) -> dict[str, Any]:
    """Parse and check a safetensors header without reading tensors; a truncated, corrupt or hostile header is
    one clear error (a JSON array, non-finite or out-of-file offsets, shapes that disagree with their bytes)."""
    try:
        info = os.stat(file)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        size = info.st_size
        with open(file, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than its header")
            n = int.from_bytes(raw, "little")
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise ValueError("header length beyond the file")
            header = strict_json(fh.read(n).decode("utf-8"))
        if not isinstance(header, dict):
            raise TypeError("the header is not a JSON object")
        meta = header.get("__metadata__", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ValueError("__metadata__ is not an object of strings")
        end = 0
        for key, entry in header.items():
            if key != "__metadata__":
                end = max(end, _tensor_bytes(key, entry)[1])
        if 8 + n + end > size:
            raise ValueError("truncated: tensor data runs past the end of the file")
        return header
    except (OSError, ValueError, TypeError, RecursionError) as err:
        raise ModelLoadError(f"{file.name} is not a valid safetensors file: {err}", "re-download the model") from None


def check_vocab(config: dict[str, Any], files: list[Path]) -> None:
    """The embedding tensor has as many rows as config.json's vocab_size (else transformers fails with a report
    of many lines, or allocates what the config claims)."""
    vocab = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    if not isinstance(vocab, int):
        return
    for file in files:
        for key, info in safetensors_header(file).items():
            if key.endswith("embed_tokens.weight") and (len(info["shape"]) != 2 or info["shape"][0] != vocab):
                raise ModelLoadError(f"config.json has vocab_size {vocab} but {key} has shape {info['shape']}",
                                     "config.json and the weights do not match")


__all__ = [
    "MAX_VOCAB",
    "check_config",
    "check_regular_files",
    "check_vocab",
    "read_bounded",
    "read_config",
    "safetensors_header",
    "strict_json",
    "weight_files",
]
