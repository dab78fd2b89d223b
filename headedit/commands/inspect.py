"""`headedit inspect MODEL`: what headedit sees in a model, and which heads an export ablated."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError
from headedit.model.heads import HeadLayout
from headedit.model.loading import check_shapes, read_config, resolve_model, weight_files


def inspect_model(model: str, revision: str | None = None) -> dict[str, Any]:
    """Layout, size and edit record of a model folder, hub id or export, without loading weights."""
    source = resolve_model(model, revision, weights=False)
    config = read_config(source.path)
    layout = HeadLayout.from_config(config)
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
    from headedit.model.loading import safetensors_header

    return safetensors_header(file)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("inspect", help="show a model's head layout, layers without heads (and the heads an export ablated)")
    p.add_argument("model", help="local model folder, hub id, or headedit:demo")
    p.add_argument("--revision", default=None)
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    info = inspect_model(args.model, args.revision)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"headedit inspect {info['model']}", show_header=False)
    for key in ("architecture", "model_type", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "hidden_size", "parameters", "dtype", "o_proj", "heads_per_layer", "layers_without_heads",
                "ablated_heads"):
        value = info.get(key)
        if key == "parameters" and value is not None:
            value = f"{value:,}"
        elif key == "heads_per_layer":
            value = _heads_per_layer(info)
            if value is None:
                continue
        elif key == "layers_without_heads":
            value = _without_heads(info.get(key) or [])
        table.add_row(key, "-" if value in (None, "") else str(value))
    console.print(table)
    return 0


def _heads_per_layer(info: dict[str, Any]) -> str | None:
    """`heads x width` per layer where layers differ (None when every layer is alike)."""
    layers = info.get("layers") or []
    shapes = [(d["heads"], d["head_width"]) for d in layers]
    if len(set(shapes)) <= 1:
        return None
    return ", ".join(f"{d['layer']}: {d['heads']}x{d['head_width']}" if d["heads"] else f"{d['layer']}: -"
                     for d in layers)


def _without_heads(layers: list[dict[str, Any]]) -> str:
    """`0-2, 4 (Qwen3NextGatedDeltaNet: linear attention)`: the layers where no head can be named."""
    groups: dict[str, list[int]] = {}
    for d in layers:
        groups.setdefault(f"{d['mixer']}: {d['kind']}", []).append(int(d["layer"]))
    return "; ".join(f"{_span(idx)} ({what})" for what, idx in groups.items())


def _span(values: list[int]) -> str:
    out: list[str] = []
    for v in values:
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)
