"""Resolve and load models safely: safetensors only, no remote code, config checked before allocation."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headedit.errors import ModelLoadError, ModelNotFoundError
from headedit.model.bundled import BUNDLED, bundled_model_path
from headedit.model.heads import HeadLayout

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# Files a checkpoint needs besides its weights (config, generation config, tokenizer, chat template).
SIDE_FILE_PATTERNS = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "LICENSE*"]


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files came from: the text the user gave and the local folder they resolved to."""

    id: str
    path: Path
    revision: str | None = None
    hub: bool = False  # True when resolved through the Hub (so `id` is a public hub id)


def resolve_model(model_id: str | os.PathLike, revision: str | None = None, weights: bool = True) -> ModelSource:
    """Local folder, `headedit:demo` / `headedit:addsub`, or a hub id resolved through huggingface_hub's cache."""
    text = str(model_id)
    if text in BUNDLED:
        return ModelSource(text, bundled_model_path(text))
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(f"model path {text} is a file, not a folder", "pass the folder holding config.json")
        return ModelSource(text, path.resolve(), revision)
    looks_local = text.startswith((".", "/", "~")) or os.sep in text.strip("/").split("/", 1)[-1] or text.count("/") != 1
    if looks_local or not _HUB_ID.match(text):
        raise ModelNotFoundError(f"model {text} not found: no such folder", "pass a local folder or a hub id NAMESPACE/NAME")
    try:
        from huggingface_hub import snapshot_download

        patterns = SIDE_FILE_PATTERNS + (["*.safetensors", "*.safetensors.index.json"] if weights else [])
        local = snapshot_download(repo_id=text, revision=revision, allow_patterns=patterns)
    except Exception as err:
        raise ModelNotFoundError(
            f"model {text} could not be fetched from the hub ({type(err).__name__})",
            "offline? download it once when online, or pass a local folder",
        ) from None
    return ModelSource(text, Path(local), revision, hub=True)


def read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path.name or path} has no config.json", "point at a transformers model folder")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"config.json is not valid JSON ({err})", "re-download the model") from None
    if not isinstance(config, dict):
        raise ModelLoadError("config.json is not a JSON object", "re-download the model")
    return config


def weight_files(path: Path, allow_pickle: bool = False) -> list[Path]:
    """The safetensors files of a checkpoint, in index order; pickle weights are refused."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ModelLoadError("model.safetensors.index.json is corrupt", "re-download the model") from None
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


def safetensors_header(file: Path) -> dict[str, Any]:
    """Parse a safetensors header without reading tensors; a truncated or corrupt file is a clear error."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than its header")
            n = int.from_bytes(raw, "little")
            if n > min(size - 8, 100 * 2**20):
                raise ValueError("header length beyond the file")
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise ValueError("truncated: tensor data runs past the end of the file")
        return header
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{file.name} is not a valid safetensors file: {err}", "re-download the model") from None


def check_shapes(layout: HeadLayout, files: list[Path]) -> int:
    """Check every attention output projection in the weights has the shape the model's geometry implies
    (headers only, no tensor read); return the parameter count."""
    params = 0
    shapes: dict[str, list[int]] = {}
    for file in files:
        for key, info in safetensors_header(file).items():
            if key == "__metadata__":
                continue
            shape = [int(dim) for dim in info.get("shape", [])]
            shapes[key] = shape
            count = 1
            for dim in shape:
                count *= dim
            params += count
    if files:
        layout.match_weights(shapes)
    return params


def check_remote_code(config: dict[str, Any], trust_remote_code: bool) -> None:
    if config.get("auto_map") and not trust_remote_code:
        raise ModelLoadError(
            "this model's config asks for remote code (auto_map), which headedit does not run by default",
            "set trust_remote_code = true under [model] in the recipe only if you trust its author",
        )


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def pick_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}", "use float32, bfloat16, float16 or auto") from None


def load_model(
    model_id: str | os.PathLike,
    dtype: str = "float32",
    device: str = "cpu",
    revision: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    device_map: str | None = None,
    max_memory: dict | None = None,
) -> tuple[Any, Any, HeadLayout]:
    """(model, tokenizer, layout), after every check that can fail without allocating the weights.

    `device_map="auto"` with `max_memory` spreads a model too large for one GPU (needs `accelerate`).
    """
    source = resolve_model(model_id, revision)
    config = read_config(source.path)
    check_remote_code(config, trust_remote_code)
    layout = HeadLayout.from_config(config)
    files = weight_files(source.path, allow_pickle)
    check_shapes(layout, files)
    device = pick_device(device)
    torch_dtype = pick_dtype(dtype, device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    placed: dict[str, Any] = {}
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise ModelLoadError("spreading a model over devices (model.max_memory) needs the accelerate package",
                                 "pip install accelerate") from None
        placed = {"device_map": device_map, "max_memory": max_memory}
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # our own events say what is loading; its bar would garble ours
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.path, dtype=torch_dtype, use_safetensors=not allow_pickle or bool(files),
            trust_remote_code=trust_remote_code, **placed,
        )
    except Exception as err:
        raise ModelLoadError(f"transformers could not load {source.id}: {type(err).__name__}: {err}".split("\n")[0],
                             "check the model files") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    if device_map is None:
        model.to(device)
    model.eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, trust_remote_code=trust_remote_code)
    except Exception as err:
        raise ModelLoadError(f"no usable tokenizer in {source.id}: {type(err).__name__}", "add the tokenizer files") from None
    return model, tokenizer, HeadLayout.from_model(model)
