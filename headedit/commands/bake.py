"""`headedit bake MODEL --heads 3.1,5.7 --out DIR`: a permanently edited checkpoint."""
from __future__ import annotations

import argparse
from typing import Any

from headedit.commands.progress import progress_reporter
from headedit.export.bake import bake


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bake", help="zero heads' o_proj columns into a new safetensors checkpoint")
    p.add_argument("model", help="local model folder, hub id, or headedit:demo")
    p.add_argument("--heads", required=True, help='head set, e.g. "3.1,5.7", "4.*", "2.0-3"')
    p.add_argument("--out", required=True, help="output folder (must not exist unless --force)")
    p.add_argument("--revision", default=None, help="hub revision of MODEL")
    p.add_argument("--gguf-file", default=None, metavar="NAME", help="which .gguf of a folder holding several")
    p.add_argument("--force", action="store_true", help="replace an existing output folder (never one another "
                   "headedit process is writing)")
    p.add_argument("--allow-empty", action="store_true", help='accept an empty head set (--heads ""): an unedited copy')
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    with progress_reporter(console) as reporter:
        out = bake(args.model, args.heads, args.out, force=args.force, revision=args.revision, gguf_file=args.gguf_file, reporter=reporter,
                   allow_empty=args.allow_empty)
    console.print(f"baked: {out}")
    return 0
