"""`headedit validate RUN [--json FILE]`: held-out intact vs the baked, reloaded edit, with intervals."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from headedit.atomic import write_text_atomic
from headedit.errors import HeadeditError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="held-out accuracy of intact vs edited model, 95%% CI and McNemar")
    p.add_argument("run", help="run folder written by `headedit discover`")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the result as JSON to FILE")
    p.set_defaults(func=run)


def check_json_target(path: Path) -> Path:
    """--json must name a file that can be written: checked before a model loads, not after the evaluation."""
    if path.is_dir():
        raise HeadeditError(f"--json {path} is a folder, not a file", f"name a file, e.g. --json {path / 'validation.json'}")
    folder = path.parent
    if not folder.is_dir():
        raise HeadeditError(f"--json: folder {folder} does not exist", "create it or choose another --json path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HeadeditError(f"--json: cannot write in {folder}", "choose a writable --json path")
    return path.resolve()


def run(args: argparse.Namespace, console: Any) -> int:
    # the pipeline and renderers load here, not at CLI start-up
    from headedit.commands.progress import reporter_for
    from headedit.commands.render import render_validation
    from headedit.pipeline import validate

    out = check_json_target(Path(args.json)) if args.json else None
    with reporter_for(console) as reporter:
        result = validate(args.run, reporter)
    console.print(render_validation(result))
    if out is not None:
        try:
            write_text_atomic(out, json.dumps(result, indent=2) + "\n")
        except OSError as err:
            raise HeadeditError(f"could not write --json {out} ({err.strerror or err}); validation.json in the run "
                                "holds the same result", "choose another --json path") from None
    console.print(result["verdict"], soft_wrap=True, markup=False, highlight=False)
    return 0
