"""`headedit demo`: the whole product on the bundled model, offline, in about a minute on a laptop CPU.

inspect -> intact accuracy -> single-head screen (heatmap) -> joint search -> bake -> reload and
held-out validation with intervals and McNemar -> side-task table -> export with card.
"""
from __future__ import annotations

import argparse
import importlib.resources
import time
from pathlib import Path
from typing import Any

from headedit.model.bundled import DEMO_ID

DEMO_RECIPE = "demo.toml"


def demo_recipe_text() -> str:
    return importlib.resources.files("headedit.recipes").joinpath(DEMO_RECIPE).read_text(encoding="utf-8")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run discover, bake, validate and export on the bundled demo model")
    p.add_argument("--runs", default="runs", help="folder for the run (default runs/)")
    p.add_argument("--out", default=None, help="export folder (default: the demo recipe's exports/demo, replaced)")
    p.add_argument("--retrain", action="store_true",
                   help="first retrain the demo model from its script (seed 0, ~1 minute) and use that checkpoint")
    p.set_defaults(func=run)


def _retrained_recipe_text(text: str, model_dir: Path) -> str:
    """The demo recipe pointed at a freshly trained checkpoint instead of the committed one."""
    return text.replace(f'id = "{DEMO_ID}"', f'id = "{model_dir.resolve().as_posix()}"', 1)


def run(args: argparse.Namespace, console: Any) -> int:
    from rich.rule import Rule

    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.commands.render import render_heatmap, render_validation, rich_reporter
    from headedit.model.inspect import inspect_model
    from headedit.pipeline import run as run_all
    from headedit.recipe import parse_recipe
    from headedit.runs import SCREEN_FILE, SELECTION_FILE, Run

    started = time.monotonic()
    text = demo_recipe_text()
    if args.retrain:
        # lazy: the CLI starts, and reports bad input, without loading torch
        from headedit.demo.train import train

        model_dir = Path(args.runs) / "demo-model"
        console.print(Rule("retrain the demo model (seed 0)"))
        with rich_reporter(console) as reporter:
            train(model_dir, seed=0, reporter=reporter)
        text = _retrained_recipe_text(text, model_dir)
    recipe = parse_recipe(text, DEMO_RECIPE)

    console.print(Rule("1. inspect"))
    info = inspect_model(recipe.model.id)
    console.print(f"{info['architecture']}: {info['num_layers']} layers x {info['num_heads']} heads "
                  f"({info['num_kv_heads']} KV), head_dim {info['head_dim']}, {info['parameters']:,} parameters")
    console.print(f"task {recipe.task.name}: discovery {recipe.task.discovery} / held-out {recipe.task.heldout}; "
                  f"side task {', '.join(recipe.validation.side_tasks) or '-'}")

    console.print(Rule("2-6. intact accuracy, screen, search, bake, validation, export"))
    run_dir = Path(args.runs) / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(args.out) if args.out else Path(recipe.export.out or "exports/demo")
    with rich_reporter(console) as reporter:
        path, result, exported = run_all(recipe, run_dir, out=out, force=True, reporter=reporter)

    found = Run.open(path)
    selection = found.read(SELECTION_FILE)
    console.print(Rule("screen (discovery split)"))
    console.print(render_heatmap(found.read(SCREEN_FILE), str(selection.get("heads", ""))))
    console.print(
        f"search: {selection.get('heads') or '(none)'}: discovery {100 * selection['intact_acc']:.2f}% -> "
        f"{100 * selection['discovery_acc']:.2f}% ({selection['gain_points']:+.2f} points)",
        markup=False, highlight=False,
    )
    console.print(Rule("held-out validation (reloaded baked checkpoint vs intact)"))
    console.print(render_validation(result))
    console.print(f"run: {path}", soft_wrap=True, markup=False, highlight=False)
    console.print(f"took {time.monotonic() - started:.0f} s", markup=False, highlight=False)
    console.print(f"export: {exported if exported else '(none: no heads selected)'}", soft_wrap=True, markup=False,
                  highlight=False)
    return 0
