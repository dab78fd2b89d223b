"""`headedit push EXPORT --repo NAMESPACE/NAME`: publish a verified export to the Hub in one commit."""
from __future__ import annotations

import argparse
from typing import Any

from headedit.commands.progress import progress_reporter
from headedit.export.hub import push_export


def add_parser(sub: Any) -> None:
    p = sub.add_parser("push", help="upload an export folder to the Hugging Face Hub in one commit")
    p.add_argument("export", help="export folder written by `headedit bake` or `headedit export`")
    p.add_argument("--repo", required=True, help="target repo NAMESPACE/NAME (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repo as private")
    p.add_argument("--revision", default=None, help="branch to commit to (created from main if missing)")
    p.add_argument("--message", default=None, help="commit message")
    p.add_argument("--force", action="store_true", help="push even if validation did not pass or is missing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    with progress_reporter(console) as reporter:
        url = push_export(args.export, args.repo, private=args.private, revision=args.revision,
                          message=args.message, force=args.force, reporter=reporter)
    console.print(url, soft_wrap=True)
    return 0
