"""`headedit plan RECIPE`: the cost of a recipe (evaluations, tokens, FLOPs, memory, time) before any forward pass."""
from __future__ import annotations

import argparse
import json
from typing import Any

from headedit.plan import (
    DEFAULT_DEVICES,
    Plan,
    device_flops,
    load_tokenizer,
    make_plan,
    plan_dtype,
    read_model_config,
)
from headedit.recipe import load_recipe


def build_plan(recipe_path: str, model: str | None = None, devices: list[str] | None = None) -> Plan:
    recipe = load_recipe(recipe_path)
    config, folder, name = read_model_config(recipe.model.id, recipe.model.revision, model)
    dtype = plan_dtype(recipe, config)
    speeds = dict(device_flops(spec, dtype, config) for spec in (devices or DEFAULT_DEVICES))
    return make_plan(recipe, config, tokenizer=load_tokenizer(folder), devices=speeds, model_name=name)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="estimate a recipe's evaluations, FLOPs, memory and time before running it")
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--model", default=None, help="model folder or config.json to use instead of the recipe's model")
    p.add_argument("--device-flops", action="append", default=None, metavar="PRESET_OR_NUMBER",
                   help="cpu (measured here), cpu-nominal, a100, h100, h200, or achieved FLOP/s (e.g. 2e14); "
                        "repeatable; default: cpu a100 h100 h200")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.set_defaults(func=run)


def _si(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _bytes(n: float) -> str:
    for factor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{int(n)} B"


def _duration(seconds: float) -> str:
    """3.2 ms, 12.5 s, 7.3 min, 4.1 h, 2.5 d: at most 7 characters, so time columns stay narrow."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs" if seconds >= 1e-7 else f"{seconds * 1e6:.1g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    for limit, div, unit in ((120, 1, "s"), (7200, 60, "min"), (2 * 86400, 3600, "h"), (float("inf"), 86400, "d")):
        if seconds < limit:
            return f"{seconds / div:.3g} {unit}"
    return "?"


_SPLITS = {"discovery": "disc", "heldout": "held"}


def stage_table(plan: Plan) -> Any:
    """Work per stage, fitted to the console: labels get shorter (stage names, split names, frame), numbers never."""
    from rich import box
    from rich.table import Table

    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.commands.render import FitTable

    def build(level: int) -> Table:
        compact = level >= 1
        table = Table(title="work per stage (upper bounds)", box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
                      show_edge=not compact, padding=(0, 0, 0, 1) if compact else (0, 1), pad_edge=False)
        table.add_column("stage", overflow="fold")
        for col in ("sets", "examples", "tokens", "FLOPs", *plan.flops_per_s):
            table.add_column(col, justify="right", no_wrap=True)
        for s in plan.stages:
            name = s.name.split(":")[0] if level >= 2 else s.name
            split = _SPLITS.get(s.split, s.split) if compact else s.split
            table.add_row(name, str(s.evaluations), f"{s.n_examples} {split}", _si(s.tokens), _si(s.flops),
                          *[_duration(s.flops / f) for f in plan.flops_per_s.values()])
        table.add_row("total", "", "", _si(sum(s.tokens for s in plan.stages)), _si(plan.flops),
                      *[_duration(plan.seconds(d)) for d in plan.flops_per_s])
        return table

    def lines() -> Any:
        from rich.console import Group
        from rich.text import Text

        def nb(text: str) -> str:  # a figure and its unit never wrap apart (rich breaks at any space)
            return text.replace(" ", "")

        out = [Text("work per stage (upper bounds)", style="italic")]
        for s in plan.stages:
            times = ", ".join(f"{d} {nb(_duration(s.flops / f))}" for d, f in plan.flops_per_s.items())
            out.append(Text(f"{s.name}: {s.evaluations} sets x {s.n_examples} {s.split} examples, "
                            f"{nb(_si(s.tokens))} tokens, {nb(_si(s.flops, 'FLOPs'))}; {times}"))
        times = ", ".join(f"{d} {nb(_duration(plan.seconds(d)))}" for d in plan.flops_per_s)
        out.append(Text(f"total: {nb(_si(sum(s.tokens for s in plan.stages)))} tokens, {nb(_si(plan.flops, 'FLOPs'))}; "
                        f"{times}"))
        return Group(*out)

    return FitTable([lambda: build(0), lambda: build(1), lambda: build(2)], lines)


def run(args: argparse.Namespace, console: Any) -> int:
    plan = build_plan(args.recipe, args.model, args.device_flops)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    from rich.table import Table

    lay = plan.layout
    console.print(f"[bold]{plan.recipe}[/] on {plan.model}: {lay['architecture']}, {lay['num_layers']} layers x "
                  f"{lay['num_heads']} heads ({lay['num_kv_heads']} KV, head_dim {lay['head_dim']}), "
                  f"{_si(plan.params)} parameters, {plan.dtype}")
    console.print(stage_table(plan))
    for s in plan.stages:
        console.print(f"{s.name}: {s.note}")
    mem = Table(title=f"memory ({plan.dtype}, batch {plan.batch_size})")
    mem.add_column("what")
    mem.add_column("bytes", justify="right")
    for key, value in plan.memory.items():
        mem.add_row(key.replace("_", " "), _bytes(value))
    console.print(mem)
    for t in plan.tokens:
        console.print(f"tokens per example, {t.task}: mean {t.mean:.1f}, max {t.max} ({t.source}, {t.sampled} sampled)"
                      + (f": {t.note}" if t.note else ""))
    if any(t.source == "assumed" for t in plan.tokens):
        # lazy: the CLI starts, and reports bad input, without loading torch
        from headedit.offline import hub_unreachable

        reason = hub_unreachable()
        if reason:
            console.print(f"note: the Hub cannot be used ({reason}): set HEADEDIT_DATA_DIR (or the recipe's "
                          "task.data_dir) to a folder with the task's files, and pass --model a local model folder",
                          markup=False, highlight=False)
    speeds = ", ".join(f"{name} {_si(f, 'FLOP/s')}" for name, f in plan.flops_per_s.items())
    console.print(f"achieved throughput assumed: {speeds}")
    for note in plan.notes:
        console.print(f"note: {note}")
    return 0
