"""`headedit run RECIPE`: discover, validate on held-out, then export the baked checkpoint.

Every output (run folder, export folder, push target) is checked before any model is loaded; a failure after
validation says the run folder was kept and how `headedit export` finishes it.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="discover + validate + export, end to end from a recipe")
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--out", metavar="RUN", default=None, help="run folder to create (default runs/<name>-<time>)")
    p.add_argument("--export", metavar="DIR", default=None, help="export folder (default: the recipe's export.out)")
    p.add_argument("--push", action="store_true", help="also push the export to the recipe's export.repo_id")
    p.add_argument("--force", action="store_true",
                   help="replace an existing export folder; export the selection even if validation did not pass")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    # the pipeline and renderers load here, not at CLI start-up
    from headedit.commands.discover import print_outcome
    from headedit.commands.export import check_export_target, check_push_target, check_run_target
    from headedit.commands.render import render_validation, reporter_for
    from headedit.errors import HeadeditError, RecipeError
    from headedit.pipeline import run as run_all
    from headedit.pipeline.export import default_export_dir
    from headedit.recipe import load_recipe
    from headedit.runs import VALIDATION_FILE, default_run_dir

    recipe = load_recipe(args.recipe)
    push = None
    if args.push:
        if not recipe.export.repo_id:
            raise RecipeError(f"recipe {args.recipe}: --push needs export.repo_id", 'add repo_id = "you/name" under [export]')
        push = recipe.export.repo_id
    run_dir = Path(args.out) if args.out else default_run_dir(recipe.name)
    target = Path(args.export) if args.export else default_export_dir(recipe)
    check_run_target(run_dir, "--out")
    check_export_target(target, args.force, "--export", recipe.model.id)
    if push:
        check_push_target(push)
    try:
        with reporter_for(console) as reporter:
            path, result, exported = run_all(recipe, run_dir, out=target, push=push, force=args.force,
                                             reporter=reporter)
    except HeadeditError as err:
        if not (run_dir / VALIDATION_FILE).is_file():
            raise
        manifest = target / "headedit.json"
        exported_now = manifest.is_file() and manifest.stat().st_mtime >= (run_dir / VALIDATION_FILE).stat().st_mtime
        if push and exported_now:  # this run's export is written; the push failed
            finish = f"headedit push {target} --repo {push}"
        else:
            finish = f"headedit export {run_dir} --out {target}" + (f" --push {push}" if push else "")
        hint = f"{err.hint}; " if err.hint else ""
        kept = f"the export {target} is written" if finish.startswith("headedit push") else f"the validated run {run_dir} is kept"
        raise type(err)(err.message, f"{hint}{kept}: `{finish}` finishes it") from None
    console.print(render_validation(result))
    console.print(result["verdict"], soft_wrap=True, markup=False, highlight=False)
    why = "no heads selected" if not result.get("heads") else \
        f"validation did not pass; `headedit export {path} --force` exports it anyway"  # a gain that did not hold, or a removal that failed
    console.print(f"export: {exported if exported else f'(none: {why})'}", soft_wrap=True, markup=False,
                  highlight=False)
    print_outcome(console, path)
    return 0
