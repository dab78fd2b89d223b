"""What headedit sees in a model without loading its weights: head geometry, size, dtypes, GGUF quantization, and
the heads an earlier headedit export ablated (its manifest, or a GGUF's `headedit.*` metadata)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError
from headedit.model.gguf_edit import read_gguf_summary
from headedit.model.heads import HeadLayout
from headedit.model.loading import (
    ModelSource,
    check_shapes,
    resolve_model,
    safetensors_header,
    source_config,
    weight_files,
)


def inspect_model(model: str, revision: str | None = None, gguf_file: str | None = None) -> dict[str, Any]:
    """Layout, size and edit record of a model folder, GGUF, hub id or export, without loading weights."""
    source = resolve_model(model, revision, weights=False, gguf_file=gguf_file)
    config = source_config(source)
    layout = HeadLayout.from_config(config)
    if source.gguf is not None:
        return _gguf_info(source, layout)
    files: list[str] | list[Path]  # Hub file names, or local paths
    if source.hub:  # read sizes from the Hub's safetensors headers instead of downloading weights
        params, dtypes, files = _hub_sizes(source.id, revision)
    else:
        files = weight_files(source.path)
        params = check_shapes(layout, files)
        dtypes = sorted({info["dtype"] for f in files for k, info in _headers(f).items() if k != "__metadata__"})
    info: dict[str, Any] = {
        "model": source.id,
        **layout.to_dict(),
        "parameters": params,
        "dtype": dtypes[0] if len(dtypes) == 1 else (dtypes or None),
        "weight_files": len(files),
        "ablated_heads": None,
    }
    manifest = source.path / "headedit.json"
    if manifest.is_file():
        try:
            record = json.loads(manifest.read_text())
            info["ablated_heads"] = record.get("heads")
            info["headedit_version"] = record.get("headedit_version")
        except json.JSONDecodeError:
            raise HeadeditError("headedit.json of this model is corrupt", "re-export the model") from None
    return info


def _hub_sizes(repo_id: str, revision: str | None) -> tuple[int | None, list[str], list[str]]:
    try:
        from huggingface_hub import get_safetensors_metadata

        meta = get_safetensors_metadata(repo_id, revision=revision)
        counts: dict[str, int] = {}
        for file_meta in meta.files_metadata.values():
            for dtype, n in file_meta.parameter_count.items():
                counts[dtype] = counts.get(dtype, 0) + n
        return sum(counts.values()), sorted(counts), list(meta.files_metadata)
    except Exception:  # sizes are informational; the layout and manifest already came through
        return None, [], []


def _headers(file: Path) -> dict[str, Any]:
    return safetensors_header(file)


def _gguf_info(source: ModelSource, layout: HeadLayout) -> dict[str, Any]:
    """A GGUF's layout with its tensor quantization types and any earlier headedit edit (from its metadata)."""
    assert source.gguf is not None
    summary = read_gguf_summary(source.gguf)
    types = Counter(t.type_name for t in summary.tensors)
    params = 0
    for t in summary.tensors:
        count = 1
        for dim in t.shape:
            count *= dim
        params += count
    return {
        "model": source.id if source.id.startswith("pkg:") else source.gguf.name,
        **layout.to_dict(),
        "parameters": params,
        "dtype": "float32 (dequantized by transformers when loaded)",
        "weight_files": 1,
        "ablated_heads": summary.metadata.get("headedit.heads"),
        "gguf": {"file": source.gguf.name, "architecture": summary.architecture, "tensor_types": dict(types),
                 "attn_output_type": next((t.type_name for t in summary.tensors
                                           if t.name.endswith("attn_output.weight")), None)},
    }


__all__ = ["inspect_model"]
