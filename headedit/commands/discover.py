"""`headedit discover RECIPE [--out RUN]` and `headedit discover --resume RUN`: screen + search, resumable."""
from __future__ import annotations

import argparse
from typing import Any

from headedit.errors import HeadeditError
from headedit.runs import SCREEN_FILE, SELECTION_FILE, Run


def add_parser(sub: Any) -> None:
    p = sub.add_parser("discover", help="screen heads and search joint ablations on the discovery split")
    p.add_argument("recipe", nargs="?", help="recipe TOML file (omit with --resume)")
    p.add_argument("--out", metavar="RUN", default=None, help="run folder to create (default runs/<name>-<time>)")
    p.add_argument("--resume", metavar="RUN", default=None, help="continue a run folder; finished work is reused")
    p.set_defaults(func=run)


def print_outcome(console: Any, run_path: Any) -> None:
    """Heatmap, selection, and the machine-readable last line `selected: L.H,...`."""
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.commands.render import render_heatmap

    found = Run.open(run_path)
    selection = found.read(SELECTION_FILE)
    heads = str(selection.get("heads", ""))
    if found.has(SCREEN_FILE):
        console.print(render_heatmap(found.read(SCREEN_FILE), heads))
    console.print(f"run: {found.path}", soft_wrap=True, markup=False, highlight=False)
    console.print(
        f"discovery accuracy {100 * selection['intact_acc']:.2f}% -> {100 * selection['discovery_acc']:.2f}% "
        f"({selection['gain_points']:+.2f} points, n={selection.get('n', '?')})",
        soft_wrap=True, markup=False, highlight=False,
    )
    from headedit.discovery.direction import outcome_lines  # remove direction: the retain tasks' moves

    for line in outcome_lines(selection):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if selection.get("found") is False:  # the evidence rule accepted no step: say so before the last line
        console.print(str(selection.get("reason") or "no set found"), soft_wrap=True, markup=False, highlight=False)
    console.print(f"selected: {heads}", soft_wrap=True, markup=False, highlight=False)


def run(args: argparse.Namespace, console: Any) -> int:
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.commands.render import rich_reporter
    from headedit.pipeline import discover
    from headedit.recipe import load_recipe

    if args.resume and args.recipe:
        raise HeadeditError("give either a recipe or --resume RUN, not both", "headedit discover --resume RUN")
    if not args.resume and not args.recipe:
        raise HeadeditError("discover needs a recipe or --resume RUN", "headedit discover recipes/demo.toml")
    with rich_reporter(console) as reporter:
        if args.resume:
            path = discover(None, args.resume, resume=True, reporter=reporter)
        else:
            path = discover(load_recipe(args.recipe), args.out, reporter=reporter)
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.pipeline.parallel import is_main_process

    if not is_main_process():  # torchrun: rank 0 alone owns the run folder and prints the outcome
        return 0
    print_outcome(console, path)
    return 0
