"""`headedit export RUN [--out DIR] [--push REPO]`: the publishing path (bake + card + push)."""
from __future__ import annotations

import argparse
from typing import Any

from headedit.pipeline.export import export_run
from headedit.commands.progress import progress_reporter


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="bake a run's selected heads, write the card, optionally push to the Hub")
    p.add_argument("run", help="run folder written by `headedit discover`")
    p.add_argument("--out", default=None, help="export folder (default: the recipe's export.out)")
    p.add_argument("--push", metavar="REPO", default=None, help="also push to this Hub repo (NAMESPACE/NAME)")
    p.add_argument("--private", action="store_true", default=None, help="create the Hub repo private")
    p.add_argument("--force", action="store_true", help="replace an existing export folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    with progress_reporter(console) as reporter:
        out = export_run(args.run, out=args.out, push=args.push, force=args.force, private=args.private,
                         reporter=reporter)
    console.print(f"export: {out}")
    return 0
