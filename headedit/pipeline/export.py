"""`headedit export RUN`: bake a run's selection, add its record and card, optionally publish.

The export folder appears whole or not at all; the manifest hashes every file in it, so push can
re-verify exactly what was validated.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

from headedit.atomic import atomic_dir, write_text_atomic
from headedit.errors import ExportError, RunError
from headedit.events import Log, Reporter, null_reporter
from headedit.export.bake import bake_into, write_manifest
from headedit.export.card import write_card
from headedit.export.hub import check_account, check_repo_id, hub_errors, hub_token, push_export, validation_passed
from headedit.model.loading import resolve_model
from headedit.pipeline.selectivity import is_removal
from headedit.recipe import Recipe
from headedit.runs import RECIPE_FILE, SCREEN_FILE, SELECTION_FILE, VALIDATION_FILE, Run

RUN_FILES_IN_EXPORT = (RECIPE_FILE, VALIDATION_FILE, SELECTION_FILE, SCREEN_FILE)


def default_export_dir(recipe: Recipe) -> Path:
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
    run = Run.open(run_dir)  # a folder that is not a run, or one from a newer headedit, is refused here
    recipe = run.recipe()
    selection = run.selection()
    heads = heads_to_export(run_dir.name, selection, force)
    export_refusal(run, recipe, force)  # a set whose held-out validation failed is not exported unforced
    source = resolve_model(recipe.model.id, recipe.model.revision)
    if push:
        _preflight_push(run_dir, push)
    target = Path(out) if out else default_export_dir(recipe)
    with atomic_dir(target, force=force, protect=(source.path,)) as tmp:
        manifest = bake_into(source, heads, tmp, reporter)
        unvalidated = heads != str(selection.get("heads") or "")  # a forced export of a set that did not pass
        for name in RUN_FILES_IN_EXPORT:
            if (run_dir / name).is_file() and not (unvalidated and name == VALIDATION_FILE):
                shutil.copy2(run_dir / name, tmp / name)
        if unvalidated:
            write_text_atomic(tmp / "README.md", _unvalidated_card(recipe.name, heads, selection))
        elif run.has(VALIDATION_FILE):
            write_card(tmp, run_dir, repo_id=push or recipe.export.repo_id)
        write_manifest(tmp, {k: v for k, v in manifest.items() if k != "files"} | {"run": recipe.name})
    reporter(Log(f"export written: {target}"))
    if push:
        url = push_export(target, push, private=recipe.export.private if private is None else private, reporter=reporter)
        reporter(Log(f"pushed: {url}"))
    return target


def _unvalidated_card(name: str, heads: str, selection: dict) -> str:
    """The card of a forced export whose heads did not pass the search's evidence test: it says so first."""
    reason = str(selection.get("reason") or "the search found no head set")
    return (f"# {name}: UNVALIDATED head ablation ({heads})\n\n"
            f"**The selection did not pass.** headedit's search found no head set whose gain on the discovery split "
            f"passed its evidence test ({reason}). This export was forced (`headedit export --force`): it zeroes the "
            f"set that came closest, `{heads}`, which was never validated on held-out data. Do not present it as an "
            f"improvement; `selection.json` (found: false) is the record.\n")


def heads_to_export(run_name: str, selection: dict, force: bool) -> str:
    """The heads an export bakes. A run whose search found no set that passed its evidence test
    (selection.json `found: false`) is refused; `force` bakes the set that came closest (`best_rejected`),
    and the copied selection.json still says `found: false`."""
    heads = str(selection.get("heads") or "")
    if selection.get("found", True) is not False and heads:
        return heads
    rejected = selection.get("best_rejected") or {}
    reason = str(selection.get("reason") or "no ablation improved discovery accuracy")
    if not force or not rejected.get("best"):
        hint = (f"nothing passed; `--force` exports the best rejected set {rejected['best']} anyway (its records say it "
                "did not pass)" if rejected.get("best") else "nothing to export; try another screen or more candidates")
        raise RunError(f"run {run_name} found no head set: {reason}", hint)
    return str(rejected["best"])


def export_refusal(run: Run, recipe: Recipe, force: bool) -> None:
    """Refuse (unless `force`) a run whose validation did not pass: a gain that did not hold on held-out data, or a
    removal that was not real and selective. A removal also needs a validation at all; an improving run may be
    exported before validating (its card then says it is unvalidated)."""
    if force:
        return
    removal = is_removal(recipe)
    if not run.has(VALIDATION_FILE):
        if removal:
            raise RunError(f"run {run.path.name} removes {recipe.task.name} but was not validated, so nothing shows "
                           "the removal is real and selective", f"run `headedit validate {run.path}` first, or pass --force")
        return
    record = run.read(VALIDATION_FILE)
    if record.get("passed") is not True and record.get("heads"):
        default = "the removal did not pass validation" if removal else "the gain did not hold on held-out data"
        raise RunError(f"run {run.path.name}: {record.get('verdict') or default}",
                       "nothing exported; --force exports it anyway, with a card that says validation did not pass")


def run_export_blocked(result: Mapping[str, Any], force: bool) -> str | None:
    """Why `headedit run` stops before exporting a set whose validation failed (None: export)."""
    if force or result.get("passed") is True or not result.get("heads"):
        return None
    return f"{result.get('verdict')}; nothing exported (`headedit export RUN --force` exports it anyway)"


def _preflight_push(run_dir: Path, repo_id: str) -> None:
    """Refuse a push that cannot succeed (bad repo id, unvalidated run, no/bad/read-only token,
    foreign namespace) before baking, so a refused push leaves no export behind."""
    check_repo_id(repo_id)
    try:
        validation_passed(run_dir, force=False)
    except ExportError as err:
        raise ExportError(err.message, f"run `headedit validate {run_dir}` first; an unvalidated export can be "
                          "pushed only with `headedit push --force`") from None
    secret = hub_token(None)
    from huggingface_hub import HfApi  # only when pushing: keeps the network stack out of plain exports

    with hub_errors(repo_id, secret):
        check_account(HfApi(token=secret), repo_id)


__all__ = ["export_run", "default_export_dir", "export_refusal", "heads_to_export", "run_export_blocked"]
