"""`headedit run RECIPE`: discover, validate on held-out, then export the baked checkpoint."""
from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="discover + validate + export, end to end from a recipe")
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--out", metavar="RUN", default=None, help="run folder to create (default runs/<name>-<time>)")
    p.add_argument("--export", metavar="DIR", default=None, help="export folder (default: the recipe's export.out)")
    p.add_argument("--push", action="store_true", help="also push the export to the recipe's export.repo_id")
    p.add_argument("--force", action="store_true", help="replace an existing export folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    from headedit.errors import RecipeError
    from headedit.pipeline import run as run_all
    from headedit.recipe import load_recipe
    from headedit.commands.render import render_validation, rich_reporter
    from headedit.commands.discover import print_outcome

    recipe = load_recipe(args.recipe)
    push = None
    if args.push:
        if not recipe.export.repo_id:
            raise RecipeError(f"recipe {args.recipe}: --push needs export.repo_id", 'add repo_id = "you/name" under [export]')
        push = recipe.export.repo_id
    with rich_reporter(console) as reporter:
        path, result, exported = run_all(recipe, args.out, out=args.export or recipe.export.out or None, push=push,
                                         force=args.force, reporter=reporter)
    console.print(render_validation(result))
    console.print(result["verdict"], soft_wrap=True, markup=False, highlight=False)
    console.print(f"export: {exported if exported else '(none: no heads selected)'}", soft_wrap=True, markup=False,
                  highlight=False)
    print_outcome(console, path)
    return 0
