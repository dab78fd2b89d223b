"""The discovery stage: screen heads on the discovery split, then search joint ablations.

One entry point, `discover`, for one process and for several (`torchrun`): ablation sets are independent, so
every process holds a replica, runs the same deterministic loop and evaluates its share of each call's sets;
only rank 0 touches the run folder (lock, the one journal, result files) and broadcasts what it already holds,
so a run resumes with any number of processes. The held-out split is never loaded here.
"""
from __future__ import annotations

import os
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from headedit.discovery import run_screen
from headedit.discovery.objective import effective, scale, unit
from headedit.discovery.search import SearchResult, SearchSpec, joint_search
from headedit.discovery.table import ScreenResult
from headedit.errors import HeadeditError, RunError
from headedit.events import Log, Reporter, null_reporter
from headedit.journal import Entry, Journal
from headedit.model.heads import format_heads
from headedit.pipeline.loaded import (
    DISCOVERY,
    early_stop_for,
    load_for,
    load_split,
    open_or_create_run,
    scorer_for,
)
from headedit.pipeline.parallel import (
    STAGE_FILES,
    MirrorJournal,
    RunMirror,
    Shard,
    active,
    broadcast,
    init_process_group,
    rank,
)
from headedit.pipeline.removal import removal_for
from headedit.recipe import Recipe, parse_recipe
from headedit.runs import RECIPE_FILE, SCREEN_FILE, SEARCH_FILE, SELECTION_FILE, Run, environment

SEARCH_SPLIT = "discovery:search"  # journal split of the search's own rows when discovery.screen_rows > 0


def discover(
    recipe: Recipe | None = None,
    run_dir: str | Path | None = None,
    resume: bool = False,
    reporter: Reporter = null_reporter,
    cancel: threading.Event | None = None,
) -> Path:
    """Screen and search on the discovery split; returns the run folder (resumable at any point)."""
    if active():
        return _discover_processes(recipe, run_dir, resume, reporter, cancel)
    run, recipe = open_or_create_run(recipe, run_dir, resume)
    with run.lock(), run.journal() as journal:
        run_discovery(run, recipe, journal, reporter, cancel)
    return run.path


def run_discovery(run: Run | RunMirror, recipe: Recipe, journal: Journal | MirrorJournal, reporter: Reporter,
                  cancel: threading.Event | None, shard: Shard | None = None) -> None:
    """The discovery stages; `shard` (several processes) splits evaluations, and `run`/`journal` may be a
    rank's read-only mirrors of rank 0's."""
    from headedit.engine.autobatch import resolve_batch  # torch-backed; loaded with the model

    loaded = load_for(recipe, reporter=reporter)
    split = load_split(recipe, loaded.task, DISCOVERY)
    env = environment(str(loaded.engine.device))
    env["attn_implementation"] = str(getattr(loaded.model.config, "_attn_implementation", "") or "")
    env["processes"] = str(shard.world_size if shard is not None else 1)
    env["dtype"] = str(loaded.model.dtype).removeprefix("torch.")  # the dtype weights are computed in
    run.update_info(task={**run.info.get("task", {}), "data_note": split.note, "source": split.source,
                          "discovery_n": len(split)},
                    environment=env)
    examples = list(split.examples)
    resolve_batch(loaded.engine, recipe.model.batch_size, loaded.task, examples, run, reporter)
    objective = effective(recipe.discovery.objective, loaded.task.kind)
    if objective != recipe.discovery.objective:
        reporter(Log(f"objective: {loaded.task.name} is a generated task, so discovery ranks by accuracy "
                     f"(discovery.objective = {recipe.discovery.objective!r} needs scored answers)"))
    # discovery.screen_rows > 0: the screen sees only the first rows and the search (and its tests) only the rest,
    # so the candidate pool is independent of the rows that judge it (evidence.py: a smaller family)
    cut = recipe.discovery.screen_rows
    screen_rows, search_rows = (examples[:cut], examples[cut:]) if cut else (examples, examples)
    scorer = scorer_for(loaded, journal, DISCOVERY, screen_rows, reporter, cancel, shard, objective=objective)
    search_scorer = scorer if not cut else scorer_for(loaded, journal, SEARCH_SPLIT, search_rows, reporter, cancel,
                                                      shard, objective=objective)
    removal = removal_for(recipe, loaded, journal, objective, reporter, cancel, shard)  # None unless "remove"
    if removal is not None:  # screens and search maximise the target's drop, retain tasks as a constraint
        reporter(Log(removal.describe()))
        scorer, search_scorer = removal.view(scorer), removal.view(search_scorer)
    if run.has(SCREEN_FILE):
        screen = ScreenResult.from_json(run.read(SCREEN_FILE))
        reporter(Log(f"screen: reusing {SCREEN_FILE} ({screen.method})"))
    else:
        screen = run_screen(recipe, loaded, scorer, screen_rows, early_stop_for(recipe, len(screen_rows)),
                            removal.reporter(recipe, reporter) if removal else reporter)
        screen = removal.label(screen) if removal else screen
        run.write(SCREEN_FILE, screen.to_json())
    if run.has(SELECTION_FILE) and run.has(SEARCH_FILE):
        reporter(Log(f"search: reusing {SELECTION_FILE}"))
        return
    spec = SearchSpec.from_recipe(recipe.discovery)
    candidates = screen.top(recipe.discovery.candidates)
    result = joint_search(search_scorer, candidates, loaded.layout.all_heads(), spec,
                          removal.search_reporter(reporter) if removal else reporter,
                          constraint=removal.constraint if removal else None)
    run.write(SEARCH_FILE, {**result.to_json(), **(removal.search_fields(result) if removal else {})})
    record = selection_record(result, len(search_rows), screen.method, spec.alpha)
    if removal is not None:
        record.update(removal.finish(result, search_scorer, reporter))
    if cut:
        record.update(screen_rows=cut, search_split=SEARCH_SPLIT)
    run.write(SELECTION_FILE, record)
    if not result.found:
        reporter(Log(f"{result.reason}; nothing will be exported (export --force bakes the best rejected set)"))


def selection_record(result: SearchResult, n: int, screen: str, alpha: float) -> dict[str, Any]:
    """selection.json: the selected set and its discovery scores, and whether the evidence rule found one.

    `found: false` is a result, not an error: `heads` is then empty, `reason` says why in words and
    `best_rejected` names the set that came closest (export refuses it without --force)."""
    return {
        "heads": format_heads(result.selected), "discovery_acc": result.selected_acc,
        "intact_acc": result.intact_acc, "gain_points": 100.0 * (result.selected_acc - result.intact_acc),
        "n": n, "screen": screen, "found": result.found, "reason": result.reason,
        "objective": result.objective, "intact_objective": result.intact_objective,
        "selected_objective": result.selected_objective,
        "objective_gain": scale(result.objective) * (result.selected_objective - result.intact_objective),
        "objective_unit": unit(result.objective), "alpha": alpha, "best_rejected": result.best_rejected,
    }


def _discover_processes(recipe: Recipe | None, run_dir: str | Path | None, resume: bool, reporter: Reporter,
                        cancel: threading.Event | None) -> Path:
    """`discover` for one of several processes; every rank returns the run folder's path."""
    import torch  # several processes mean torch.distributed; only this path needs it at this point
    import torch.distributed as dist

    spec_device = getattr(getattr(recipe, "model", None), "device", "auto")
    cuda = torch.cuda.is_available() and spec_device != "cpu"
    init_process_group("nccl" if cuda else "gloo")
    if not cuda:
        device = "cpu"
    else:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(torch.device(device))
    with ExitStack() as stack:
        state: dict[str, Any]
        run: Run | RunMirror
        journal: Journal | MirrorJournal
        if rank() == 0:
            try:
                run, recipe = open_or_create_run(recipe, run_dir, resume)
                stack.enter_context(run.lock())
                journal = stack.enter_context(run.journal())
                state = {"recipe": run.recipe_text, "path": str(run.path), "info": dict(run.info),
                         "files": {n: run.read(n) for n in STAGE_FILES if run.has(n)},
                         "entries": [(e.split, e.heads, e.n, np.packbits(e.bits), e.stage, e.created, e.values)
                                     for e in journal.entries()]}
            except HeadeditError as err:
                broadcast({"error": (err.message, err.hint, type(err).__name__)}, device)
                raise
            broadcast(state, device)
        else:
            state = broadcast(None, device)
            if "error" in state:
                message, hint, _ = state["error"]
                raise RunError(f"rank 0 could not start: {message}", hint)
            recipe = parse_recipe(state["recipe"], Path(state["path"]) / RECIPE_FILE)
            entries = [Entry(s, h, n, np.unpackbits(b, count=n).astype(bool), st, c, v)
                       for s, h, n, b, st, c, v in state["entries"]]
            journal = MirrorJournal(entries)
            run = RunMirror(state["path"], state["info"], state["files"])
            reporter = null_reporter
        run_discovery(run, recipe, journal, reporter, None, shard=Shard(device, cancel))
    dist.barrier()
    return Path(state["path"])


__all__ = ["discover", "run_discovery", "selection_record"]
