"""`headedit export RUN`: bake a run's selection, add its record and card, optionally publish.

The export folder appears whole or not at all; the manifest hashes every file in it, so push can
re-verify exactly what was validated.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from headedit.atomic import atomic_dir
from headedit.export.bake import bake_into, read_manifest, write_manifest
from headedit.errors import ExportError, RunError
from headedit.events import Log, Reporter, null_reporter
from headedit.model.loading import resolve_model

RUN_FILES_IN_EXPORT = ("recipe.toml", "validation.json", "selection.json", "screen.json")


def run_selection(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "selection.json"
    if not path.is_file():
        raise RunError(f"{run_dir} has no selection.json", "finish discovery first: `headedit discover --resume RUN`")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise RunError(f"selection.json in {run_dir} is corrupt", "re-run the search: `headedit discover --resume RUN`") from None


def run_recipe(run_dir: Path) -> Any:
    from headedit.recipe import load_recipe

    path = Path(run_dir) / "recipe.toml"
    if not path.is_file():
        raise RunError(f"{run_dir} is not a headedit run folder (no recipe.toml)", "pass the folder `headedit discover` wrote")
    return load_recipe(path)


def default_export_dir(run_dir: Path, recipe: Any) -> Path:
    return Path(recipe.export.out) if recipe.export.out else Path("exports") / recipe.name


def export_run(
    run_dir: str | Path,
    out: str | Path | None = None,
    push: str | None = None,
    force: bool = False,
    private: bool | None = None,
    reporter: Reporter = null_reporter,
) -> Path:
    """Bake the run's selected heads with card and run record into `out`; push when a repo is given."""
    run_dir = Path(run_dir)
    from headedit.runs import Run

    Run.open(run_dir)  # a folder that is not a run, or one from a newer headedit, is refused here
    recipe = run_recipe(run_dir)
    selection = run_selection(run_dir)
    heads = selection.get("heads")
    if not heads:
        raise RunError(f"run {run_dir.name} selected no heads (no ablation improved discovery accuracy)",
                       "nothing to export; try another screen or more candidates")
    source = resolve_model(recipe.model.id, recipe.model.revision)
    if push:
        _preflight_push(run_dir, push)
    target = Path(out) if out else default_export_dir(run_dir, recipe)
    with atomic_dir(target, force=force, protect=(source.path,)) as tmp:
        manifest = bake_into(source, heads, tmp, reporter)
        for name in RUN_FILES_IN_EXPORT:
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, tmp / name)
        try:
            from headedit.export.card import write_card
        except ImportError:  # pragma: no cover - card module ships with headedit
            write_card = None
        if write_card is not None and (run_dir / "validation.json").is_file():
            write_card(tmp, run_dir, repo_id=push or recipe.export.repo_id)
        write_manifest(tmp, {k: v for k, v in manifest.items() if k != "files"} | {"run": recipe.name})
    reporter(Log(f"export written: {target}"))
    if push:
        from headedit.export.hub import push_export

        url = push_export(target, push, private=recipe.export.private if private is None else private, reporter=reporter)
        reporter(Log(f"pushed: {url}"))
    return target


def _preflight_push(run_dir: Path, repo_id: str) -> None:
    """Refuse a push that cannot succeed (bad repo id, unvalidated run, no/bad/read-only token,
    foreign namespace) before baking, so a refused push leaves no export behind."""
    from headedit.export.hub import _check_account, _token, _validation_passed, check_repo_id, hub_errors

    check_repo_id(repo_id)
    try:
        _validation_passed(run_dir, force=False)
    except ExportError as err:
        raise ExportError(err.message, f"run `headedit validate {run_dir}` first; an unvalidated export can be "
                          "pushed only with `headedit push --force`") from None
    secret = _token(None)
    from huggingface_hub import HfApi

    with hub_errors(repo_id, secret):
        _check_account(HfApi(token=secret), repo_id)


__all__ = ["export_run", "run_selection", "run_recipe", "read_manifest"]
