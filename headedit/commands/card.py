"""`headedit card RUN [--export DIR]`: render the model card (and heatmap) of a run into its export."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headedit.errors import ExportError
from headedit.export.card import write_card


def add_parser(sub: Any) -> None:
    p = sub.add_parser("card", help="write README.md (model card) and heads.png into a run's export folder")
    p.add_argument("run", help="run folder written by `headedit discover` (with validation.json)")
    p.add_argument("--export", default=None, help="export folder (default: the recipe's export folder)")
    p.add_argument("--repo", default=None, help="NAMESPACE/NAME the card's usage snippet should load")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    export = args.export
    if export is None:
        from headedit.pipeline.export import default_export_dir  # the pipeline loads lazily: fast CLI start
        from headedit.runs import Run

        export = default_export_dir(Run.open(Path(args.run)).recipe())
    if not Path(export).is_dir():
        raise ExportError(f"export folder {export} not found", "bake it first (`headedit export RUN`) or pass --export DIR")
    if args.repo is not None:
        # lazy: the CLI starts, and reports bad input, without loading torch
        from headedit.export.hub import check_repo_id

        check_repo_id(args.repo)
    path = write_card(export, args.run, repo_id=args.repo)
    console.print(f"card written: {path}", soft_wrap=True)
    return 0
