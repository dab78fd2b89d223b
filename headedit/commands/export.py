"""`headedit export RUN [--out DIR] [--push REPO]`: the publishing path (bake + card + push).

Also the output checks `run` and `export` share: every place they will write is checked, with the option of
the command that names it, before a model is touched, so a refusal costs seconds, not a discovery.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from headedit.errors import OutputExistsError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="bake a run's selected heads, write the card, optionally push to the Hub")
    p.add_argument("run", help="run folder written by `headedit discover`")
    p.add_argument("--out", default=None, help="export folder (default: the recipe's export.out)")
    p.add_argument("--push", metavar="REPO", default=None, help="also push to this Hub repo (NAMESPACE/NAME)")
    p.add_argument("--private", action="store_true", default=None, help="create the Hub repo private")
    p.add_argument("--force", action="store_true",
                   help="replace an existing export folder; export a run whose validation did not pass, or whose search found "
                        "no set (its best rejected set); the card says so")
    p.set_defaults(func=run)


def _writable_parent(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` when it cannot be written into, else None."""
    parent = path.parent if str(path.parent) else Path(".")
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
        return parent
    return None


def check_export_target(target: Path, force: bool, option: str, model_id: str | None = None) -> None:
    """Refuse, naming `option` (`--export` on run, `--out` on export), an export folder that cannot be written."""
    if target.exists() and not target.is_dir():
        raise OutputExistsError(f"export path {target} is a file, not a folder", f"choose another {option} DIR")
    if target.exists() and not force:
        raise OutputExistsError(f"export folder {target} already exists",
                                f"pass --force to replace it, or choose another {option} DIR")
    if target.is_dir() and any(target.iterdir()) and not (target / "headedit.json").is_file():
        raise OutputExistsError(f"export folder {target} is not an earlier export (no headedit.json), so --force "
                                "will not replace it", f"choose another {option} DIR, or delete that folder yourself")
    blocked = _writable_parent(target)
    if blocked is not None:
        raise OutputExistsError(f"cannot write the export folder {target}: {blocked} is not writable",
                                f"choose another {option} DIR")
    if model_id is not None and Path(model_id).expanduser().is_dir():
        source = Path(model_id).expanduser().resolve()
        out = target.resolve()
        if out == source or source in out.parents or out in source.parents:
            raise OutputExistsError(f"export folder {target} overlaps the source model folder {model_id}",
                                    f"choose an {option} DIR outside the source")


def check_run_target(run_dir: Path, option: str = "--out") -> None:
    """Refuse a run folder that exists with content, or whose parent cannot be written."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise OutputExistsError(f"run folder {run_dir} already exists",
                                f"choose another {option} RUN, or resume it with `headedit discover --resume {run_dir}`")
    blocked = _writable_parent(run_dir)
    if blocked is not None:
        raise OutputExistsError(f"cannot create the run folder {run_dir}: {blocked} is not writable",
                                f"choose another {option} RUN")


def check_push_target(repo_id: str) -> None:
    """A push that cannot succeed (bad repo id, no token, read-only token, foreign namespace) fails now."""
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.export.hub import check_account, check_repo_id, hub_errors, hub_token

    check_repo_id(repo_id)
    secret = hub_token(None)
    from huggingface_hub import HfApi  # only when pushing: keeps the network stack out of plain commands

    with hub_errors(repo_id, secret):
        check_account(HfApi(token=secret), repo_id)


def run(args: argparse.Namespace, console: Any) -> int:
    # the pipeline and the reporter load here, not at CLI start-up
    from headedit.commands.progress import reporter_for
    from headedit.pipeline.export import default_export_dir, export_run, heads_to_export
    from headedit.runs import Run

    found = Run.open(Path(args.run))
    recipe = found.recipe()
    heads_to_export(found.path.name, found.selection(), args.force)  # a run that found nothing: refused here
    target = Path(args.out) if args.out else default_export_dir(recipe)
    check_export_target(target, args.force, "--out", recipe.model.id)
    with reporter_for(console) as reporter:
        out = export_run(args.run, out=target, push=args.push, force=args.force, private=args.private,
                         reporter=reporter)
    console.print(f"export: {out}", soft_wrap=True, markup=False, highlight=False)
    return 0
