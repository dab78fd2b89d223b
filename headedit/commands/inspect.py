"""`headedit inspect MODEL`: prints what `headedit.model.inspect.inspect_model` finds (table or JSON)."""
from __future__ import annotations

import argparse
import json
from typing import Any

from headedit.model.inspect import inspect_model


def add_parser(sub: Any) -> None:
    p = sub.add_parser("inspect", help="show a model's head layout, layers without heads (and the heads an export ablated)")
    p.add_argument("model", help="local model folder, hub id, or headedit:demo")
    p.add_argument("--revision", default=None)
    p.add_argument("--gguf-file", default=None, metavar="NAME", help="which .gguf of a folder holding several")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    info = inspect_model(args.model, args.revision, gguf_file=args.gguf_file)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"headedit inspect {info['model']}", show_header=False)
    for key in ("architecture", "model_type", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "hidden_size", "parameters", "dtype", "o_proj", "heads_per_layer", "layers_without_heads",
                "ablated_heads", "gguf"):
        value = info.get(key)
        if key == "parameters" and value is not None:
            value = f"{value:,}"
        elif key == "heads_per_layer":
            value = _heads_per_layer(info)
            if value is None:
                continue
        elif key == "layers_without_heads":
            value = _without_heads(info.get(key) or [])
        elif key == "gguf":
            if not value:
                continue
            value = f"{value['file']} ({value['architecture']}): " + ", ".join(
                f"{n} {t}" for t, n in sorted(value["tensor_types"].items(), key=lambda kv: -kv[1])) + " tensors"
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
