"""`headedit validate RUN [--json FILE]`: held-out intact vs the baked, reloaded edit, with intervals."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from headedit.atomic import write_text_atomic


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="held-out accuracy of intact vs edited model, 95%% CI and McNemar")
    p.add_argument("run", help="run folder written by `headedit discover`")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the result as JSON to FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    from headedit.pipeline import validate
    from headedit.commands.render import render_validation, rich_reporter

    with rich_reporter(console) as reporter:
        result = validate(args.run, reporter)
    console.print(render_validation(result))
    if args.json:
        out = Path(args.json)
        write_text_atomic(out.resolve(), json.dumps(result, indent=2) + "\n")
    console.print(result["verdict"], soft_wrap=True, markup=False, highlight=False)
    return 0
