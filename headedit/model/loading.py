"""Resolve and load models safely: safetensors only, no remote code, config checked before allocation."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headedit.errors import ModelLoadError, ModelNotFoundError
from headedit.model.bundled import BUNDLED, bundled_model_path
from headedit.model.files import (  # re-exported: callers import the model-file readers from here
    check_regular_files,
    check_vocab,
    read_config,
    safetensors_header,
    weight_files,
)
from headedit.model.gguf_source import PKG_PREFIX, find_gguf, gguf_config, gguf_tokenizer, load_gguf_model, package_file
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
    gguf: Path | None = None  # a GGUF checkpoint: the file (`path` is its folder)


def resolve_model(model_id: str | os.PathLike, revision: str | None = None, weights: bool = True,
                  gguf_file: str | None = None) -> ModelSource:
    """Local folder, `.gguf` file (or a folder holding one; `gguf_file` chooses among several), `pkg:PACKAGE/FILE`,
    `headedit:demo` / `headedit:addsub`, or a hub id resolved through huggingface_hub's cache."""
    text = str(model_id)
    if text in BUNDLED:
        return ModelSource(text, bundled_model_path(text))
    path = package_file(text) if text.startswith(PKG_PREFIX) else Path(text).expanduser()
    if path.exists():
        gguf = find_gguf(path, gguf_file)
        if gguf is not None:
            return ModelSource(text, gguf.parent.resolve(), revision, gguf=gguf.resolve())
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


def source_config(source: ModelSource) -> dict[str, Any]:
    """The checkpoint's config: config.json, or the config a GGUF implies."""
    return gguf_config(source.gguf) if source.gguf is not None else read_config(source.path)


def source_weight_files(source: ModelSource, allow_pickle: bool = False) -> list[Path]:
    """The safetensors files to check and hash (none for a GGUF: its own header is checked when read)."""
    return [] if source.gguf is not None else weight_files(source.path, allow_pickle)


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
    gguf_file: str | None = None,
) -> tuple[Any, Any, HeadLayout]:
    """(model, tokenizer, layout), after every check that can fail without allocating the weights.

    `device_map="auto"` with `max_memory` spreads a model too large for one GPU (needs `accelerate`).
    """
    source = resolve_model(model_id, revision, gguf_file=gguf_file)
    config = source_config(source)
    check_remote_code(config, trust_remote_code)
    check_regular_files(source.path, SIDE_FILE_PATTERNS)
    layout = HeadLayout.from_config(config)
    files = source_weight_files(source, allow_pickle)
    check_shapes(layout, files)
    check_vocab(config, files)
    device = pick_device(device)
    torch_dtype = pick_dtype(dtype, device)
    from transformers import AutoModelForCausalLM

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
        model = load_gguf_model(source.gguf, torch_dtype) if source.gguf is not None else AutoModelForCausalLM.from_pretrained(
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
        # transformers declares PreTrainedModel.to with @wraps(nn.Module.to): mypy then wants `self` as argument 1
        model.to(device)  # type: ignore[arg-type]
    model.eval()
    tokenizer = load_tokenizer(source, trust_remote_code)
    return model, tokenizer, HeadLayout.from_model(model)


def load_tokenizer(source: ModelSource, trust_remote_code: bool = False, chat: bool = False) -> Any:
    """The model's tokenizer, or one ModelLoadError line (missing files; `chat` without a chat template)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    if source.gguf is None:
        check_regular_files(source.path, SIDE_FILE_PATTERNS)  # a FIFO named tokenizer.json would block the read
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its multi-line warnings about missing files would bury our one line
    try:
        tokenizer = (gguf_tokenizer(source.gguf) if source.gguf is not None
                     else AutoTokenizer.from_pretrained(source.path, trust_remote_code=trust_remote_code))
    except ModelLoadError:
        raise
    except Exception as err:
        raise ModelLoadError(f"no usable tokenizer in {source.id}: {type(err).__name__}",
                             "add the tokenizer files (tokenizer.json, tokenizer_config.json) to the model folder") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if isinstance(tokenizer, bool) or not callable(tokenizer):
        raise ModelLoadError(f"no usable tokenizer in {source.id}", "add the tokenizer files to the model folder")
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"task.chat is true but the tokenizer of {source.id} has no chat template",
                             "set task.chat = false, or use the instruct model that ships a chat template")
    return tokenizer
