"""`headedit tui [RECIPE_OR_RUN]`: open the terminal UI (textual is imported only here, lazily)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tui", help="open the terminal UI (setup, discovery, candidates, validation, publish)")
    p.add_argument("target", nargs="?", default=None, metavar="RECIPE_OR_RUN",
                   help="a recipe .toml to fill the form with, or a run folder to reopen")
    p.add_argument("--runs", default="runs", help="folder holding run folders (default: runs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    target = Path(args.target) if args.target else None
    if target is not None and not target.exists():
        raise HeadeditError(f"{target} not found", "pass a recipe .toml or a run folder, or nothing to start empty")
    from headedit.tui.app import HeadeditApp  # lazy: keeps textual out of CLI start-up

    app = HeadeditApp(target, runs_root=args.runs)
    app.run()
    if app.return_code:  # the app died; Textual has printed the traceback above this line
        sys.stderr.write("headedit: internal error: the terminal UI stopped on an unexpected error (traceback "
                         "above); run folders keep every finished step\n")
        return app.return_code
    return 0
