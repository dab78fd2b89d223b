"""Stage functions shared by the CLI and the TUI: discover, evaluate a hand-made set, validate, run.

Each stage takes a recipe or a run folder, emits events through `reporter`, checks `cancel`
between units of work, and leaves everything it finished in the run folder, so a cancelled or
killed stage resumes where it stopped. The held-out split is loaded only by `validate`.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from headedit.errors import RecipeError, RunError
from headedit.events import Log, Reporter, StageFinished, StageStarted, null_reporter
from headedit.model.heads import Head, HeadLayout, format_heads, parse_heads
from headedit.runs import (
    JOURNAL_FILE, RECIPE_FILE, SCREEN_FILE, SEARCH_FILE, SELECTION_FILE, Journal, Run, default_run_dir,
    environment, weight_hashes,
)

DISCOVERY = "discovery"
SETS_PER_CALL = 16  # head sets per engine call (and per journal commit)


@dataclass
class Loaded:
    """A recipe's model, engine and task, loaded once per stage."""

    recipe: Any
    model: Any
    tokenizer: Any
    layout: HeadLayout
    engine: Any
    task: Any


def load_for(recipe: Any, model_id: str | None = None, reporter: Reporter = null_reporter,
             placement: Any = None) -> Loaded:
    """Load the recipe's model (or `model_id`, e.g. a baked export) with an engine for its task.

    `placement` (`distributed.Placement`) says where: default from the recipe's device and max_memory,
    and under torchrun this process's GPU (or GPU slice).
    """
    from headedit.pipeline.distributed import placement_for
    from headedit.engine.core import Engine
    from headedit.model.loading import load_model
    from headedit.tasks import get_task

    m = recipe.model
    where = placement or placement_for(m)
    reporter(Log(f"loading model {model_id or m.id} on {where.device}"
                 + (f" (device_map over {dict(where.max_memory or {})})" if where.device_map else "")))
    model, tokenizer, layout = load_model(
        model_id or m.id, dtype=m.dtype, device=where.device, revision=None if model_id else m.revision,
        trust_remote_code=m.trust_remote_code, device_map=where.device_map,
        max_memory=dict(where.max_memory) if where.max_memory else None,
    )
    batch = 16 if m.batch_size == "auto" else int(m.batch_size)
    engine = Engine(model, tokenizer, layout, batch_size=batch,
                    chat_template_kwargs=dict(m.chat_template_kwargs) or None, chat=recipe.task.chat)
    return Loaded(recipe, model, tokenizer, layout, engine, get_task(recipe.task.name))


def load_split(recipe: Any, task: Any, split: str, size: int | None = None) -> Any:
    """A task split of the recipe's size; a short split is an error (sizes larger than the data)."""
    from headedit.errors import TaskError

    want = size if size is not None else (recipe.task.discovery if split == DISCOVERY else recipe.task.heldout)
    data = task.load(split, size=want, seed=recipe.task.seed, data_dir=recipe.task.data_dir)
    if len(data) < want:
        raise TaskError(f"task {task.name} has only {len(data)} {split} examples, recipe asks for {want}",
                        f"lower task.{split if split == DISCOVERY else 'heldout'} in the recipe")
    return data


def run_recipe(run: Run) -> Any:
    from headedit.recipe import parse_recipe

    try:
        return parse_recipe(run.recipe_text, run.file(RECIPE_FILE))
    except RecipeError as err:
        raise RunError(f"run {run.path}: its recipe.toml no longer validates: {err.message}",
                       err.hint or "start a new run") from None


def _scorer(loaded: Loaded, journal: Journal, split_name: str, examples: Sequence[Any], reporter: Reporter,
            cancel: threading.Event | None, shard: Any = None):
    """The journaled scorer; with a `distributed.Shard`, each call's sets are split over the processes."""
    from headedit.discovery.scorer import Scorer

    def eval_fn(sets: list[tuple[Head, ...]], start: int, stop: int):
        return loaded.engine.correctness(loaded.task, examples[start:stop], sets)

    if shard is not None:  # SETS_PER_CALL per process; cancel is checked collectively inside the shard
        return Scorer(journal, split_name, len(examples), shard.wrap(eval_fn), reporter,
                      SETS_PER_CALL * shard.world_size, None)
    return Scorer(journal, split_name, len(examples), eval_fn, reporter, SETS_PER_CALL, cancel)


def early_stop_for(recipe: Any, n: int):
    from headedit.discovery.early_stop import EarlyStop

    if not recipe.discovery.early_stop:
        return None
    chunk = max(16, math.ceil(n / 16))
    return EarlyStop(chunk=chunk, alpha=recipe.discovery.early_stop_alpha, min_n=chunk)


# ---- discover ---------------------------------------------------------------------------------
def _run_info(recipe: Any) -> dict[str, Any]:
    from headedit import __version__
    from headedit.model.loading import resolve_model

    source = resolve_model(recipe.model.id, recipe.model.revision)
    revision = recipe.model.revision or (source.path.name if source.hub else None)
    return {
        "headedit_version": __version__, "name": recipe.name,
        "model": {"id": recipe.model.id, "revision": revision, "sha256": weight_hashes(source.path)},
        "environment": environment(),
        "task": {"name": recipe.task.name, "discovery_n": recipe.task.discovery, "heldout_n": recipe.task.heldout,
                 "seed": recipe.task.seed, "data_note": ""},
    }


def discover(
    recipe: Any = None,
    run_dir: str | Path | None = None,
    resume: bool = False,
    reporter: Reporter = null_reporter,
    cancel: threading.Event | None = None,
) -> Path:
    """Screen and search on the discovery split; returns the run folder (resumable at any point).

    Under torchrun with several processes, `distributed.discover` shards every evaluation over them.
    """
    from headedit.pipeline import distributed

    if distributed.active():
        return distributed.discover(recipe, run_dir, resume, reporter, cancel)
    run, recipe = open_or_create_run(recipe, run_dir, resume)
    with run.lock(), run.journal() as journal:
        _discover(run, recipe, journal, reporter, cancel)
    return run.path


def open_or_create_run(recipe: Any, run_dir: str | Path | None, resume: bool) -> tuple[Run, Any]:
    """(run, recipe): the run to resume with its own recipe, or a new run folder after every cheap check."""
    if resume:
        if run_dir is None:
            raise RunError("--resume needs the run folder", "headedit discover --resume RUN")
        run = Run.open(Path(run_dir))
        return run, run_recipe(run)
    if recipe is None or not getattr(recipe, "source_text", ""):
        raise RecipeError("discover needs a recipe loaded from TOML text", "use load_recipe(path)")
    _preflight(recipe)
    run = Run.create(Path(run_dir) if run_dir else default_run_dir(recipe.name), recipe.source_text,
                     _run_info(recipe))
    return run, recipe


def _preflight(recipe: Any) -> None:
    """Every cheap check that can fail, before a run folder exists (a refused run leaves nothing behind)."""
    from headedit.model.loading import check_remote_code, check_shapes, read_config, resolve_model, weight_files
    from headedit.tasks import get_task

    source = resolve_model(recipe.model.id, recipe.model.revision)
    config = read_config(source.path)
    check_remote_code(config, recipe.model.trust_remote_code)
    check_shapes(HeadLayout.from_config(config), weight_files(source.path))
    task = get_task(recipe.task.name)
    load_split(recipe, task, DISCOVERY)
    load_split(recipe, task, "heldout")  # sizes larger than the data fail now, not after discovery


def _discover(run: Run, recipe: Any, journal: Journal, reporter: Reporter, cancel: threading.Event | None,
              shard: Any = None) -> None:
    """The discovery stages; `shard` (several processes) splits evaluations, and `run`/`journal` may be a
    rank's read-only mirrors of rank 0's (see `headedit.pipeline.distributed`)."""
    from headedit.engine.autobatch import resolve_batch
    from headedit.discovery import run_screen
    from headedit.discovery.search import SearchSpec, joint_search
    from headedit.discovery.table import ScreenResult

    loaded = load_for(recipe, reporter=reporter)
    split = load_split(recipe, loaded.task, DISCOVERY)
    env = environment(str(loaded.engine.device))
    env["attn_implementation"] = str(getattr(loaded.model.config, "_attn_implementation", "") or "")
    env["processes"] = str(shard.world_size if shard is not None else 1)
    run.update_info(task={**run.info.get("task", {}), "data_note": split.note, "source": split.source,
                          "discovery_n": len(split)},
                    environment=env)
    examples = list(split.examples)
    resolve_batch(loaded.engine, recipe.model.batch_size, loaded.task, examples, run, reporter)
    scorer = _scorer(loaded, journal, DISCOVERY, examples, reporter, cancel, shard)
    if run.has(SCREEN_FILE):
        screen = ScreenResult.from_json(run.read(SCREEN_FILE))
        reporter(Log(f"screen: reusing {SCREEN_FILE} ({screen.method})"))
    else:
        screen = run_screen(recipe, loaded, scorer, examples, early_stop_for(recipe, len(examples)), reporter)
        run.write(SCREEN_FILE, screen.to_json())
    if run.has(SELECTION_FILE) and run.has(SEARCH_FILE):
        reporter(Log(f"search: reusing {SELECTION_FILE}"))
        return
    spec = SearchSpec.from_recipe(recipe.discovery)
    candidates = screen.top(recipe.discovery.candidates)
    result = joint_search(scorer, candidates, loaded.layout.all_heads(), spec, reporter)
    run.write(SEARCH_FILE, result.to_json())
    run.write(SELECTION_FILE, {
        "heads": format_heads(result.selected), "discovery_acc": result.selected_acc,
        "intact_acc": result.intact_acc, "gain_points": 100.0 * (result.selected_acc - result.intact_acc),
        "n": len(examples), "screen": screen.method,
    })


def selected_heads(run_dir: str | Path) -> str:
    run = Run.open(Path(run_dir))
    if not run.has(SELECTION_FILE):
        raise RunError(f"run {run.path} has no selection yet", f"finish it: headedit discover --resume {run.path}")
    return str(run.read(SELECTION_FILE).get("heads", ""))


# ---- a hand-made set ----------------------------------------------------------------------------
_SESSIONS: dict[Path, tuple[Loaded, list[Any]]] = {}


def evaluate_set(run_dir: str | Path, heads: str | Sequence[Head], reporter: Reporter = null_reporter,
                 keep_loaded: bool = True) -> float:
    """Discovery accuracy of a hand-made head set (journaled, so asking twice is free)."""
    run = Run.open(Path(run_dir))
    key = run.path.resolve()
    if key in _SESSIONS:
        loaded, examples = _SESSIONS[key]
    else:
        recipe = run_recipe(run)
        loaded = load_for(recipe, reporter=reporter)
        examples = list(load_split(recipe, loaded.task, DISCOVERY).examples)
        if keep_loaded:
            _SESSIONS[key] = (loaded, examples)
    chosen = parse_heads(heads, loaded.layout) if isinstance(heads, str) else tuple(heads)
    with run.lock(), run.journal() as journal:
        scorer = _scorer(loaded, journal, DISCOVERY, examples, reporter, None)
        reporter(StageStarted("manual", total=1, description=f"evaluate {format_heads(chosen) or '(intact)'}"))
        scorer.ensure([chosen], stage="manual")
        acc = scorer.accuracy(chosen)
        reporter(StageFinished("manual", f"{format_heads(chosen) or '(intact)'}: {100 * acc:.2f}%"))
    return acc


def release(run_dir: str | Path | None = None) -> None:
    """Drop models kept by evaluate_set (all, or one run's)."""
    if run_dir is None:
        _SESSIONS.clear()
    else:
        _SESSIONS.pop(Path(run_dir).resolve(), None)


def select(run_dir: str | Path, heads: str | Sequence[Head], reporter: Reporter = null_reporter) -> dict:
    """Make a hand-picked set the run's selection (validate and export read selection.json).

    The set is scored on the discovery split (journaled); the search's own choice stays on record
    under `search_heads`/`search_discovery_acc`, and a validation of another set is discarded.
    """
    run = Run.open(Path(run_dir))
    if not run.has(SELECTION_FILE):
        raise RunError(f"run {run.path} has no selection yet", f"finish it: headedit discover --resume {run.path}")
    selection = run.read(SELECTION_FILE)
    acc = evaluate_set(run.path, heads, reporter=reporter)
    chosen = format_heads(parse_heads(heads) if isinstance(heads, str) else heads)
    if selection.get("heads") == chosen:
        return selection
    intact = selection.get("intact_acc")
    record = {k: v for k, v in selection.items() if not k.startswith("search_")}
    record.update({
        "heads": chosen, "discovery_acc": acc, "chosen_by": "hand",
        "gain_points": None if intact is None else 100.0 * (acc - float(intact)),
        "search_heads": selection.get("search_heads", selection.get("heads")),
        "search_discovery_acc": selection.get("search_discovery_acc", selection.get("discovery_acc")),
    })
    with run.lock():
        run.write(SELECTION_FILE, record)
        stale = run.path / "validation.json"
        if stale.is_file():
            stale.unlink()
    reporter(Log(f"selection set by hand: {chosen} (search chose {record['search_heads'] or '(none)'})"))
    return record


# ---- validate and run ---------------------------------------------------------------------------
def validate(run_dir: str | Path, reporter: Reporter = null_reporter, cancel: threading.Event | None = None) -> dict:
    """Held-out intact vs the reloaded baked checkpoint; writes and returns validation.json's content."""
    from headedit.pipeline.validate import validate_run

    return validate_run(Path(run_dir), reporter, cancel)


def run(
    recipe: Any,
    run_dir: str | Path | None = None,
    out: str | Path | None = None,
    push: str | None = None,
    force: bool = False,
    reporter: Reporter = null_reporter,
    cancel: threading.Event | None = None,
) -> tuple[Path, dict, Path | None]:
    """discover, validate, export: (run folder, validation, export folder or None when nothing was selected)."""
    from headedit.pipeline.export import export_run

    path = discover(recipe, run_dir, reporter=reporter, cancel=cancel)
    result = validate(path, reporter, cancel)
    if not result.get("heads"):
        reporter(Log("no head set improved discovery accuracy: nothing to export"))
        return path, result, None
    exported = export_run(path, out=out, push=push, force=force, reporter=reporter)
    return path, result, Path(exported)


__all__ = ["discover", "evaluate_set", "select", "validate", "run", "selected_heads", "load_for", "load_split", "release",
           "JOURNAL_FILE"]
