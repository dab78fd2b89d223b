"""Hand-made head sets: score one on the discovery split, or make it the run's selection.

A set's evaluations are journaled like the search's, so asking twice is free; the model stays loaded between
calls (the TUI's candidates screen asks many times).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from headedit.events import Log, Reporter, StageFinished, StageStarted, null_reporter
from headedit.model.heads import Head, format_heads, parse_heads
from headedit.pipeline.loaded import DISCOVERY, Loaded, load_for, load_split, scorer_for
from headedit.runs import SELECTION_FILE, VALIDATION_FILE, Run

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
        recipe = run.recipe()
        loaded = load_for(recipe, reporter=reporter)
        examples = list(load_split(recipe, loaded.task, DISCOVERY).examples)
        if keep_loaded:
            _SESSIONS[key] = (loaded, examples)
    chosen = parse_heads(heads, loaded.layout) if isinstance(heads, str) else tuple(heads)
    with run.lock(), run.journal() as journal:
        scorer = scorer_for(loaded, journal, DISCOVERY, examples, reporter, None)
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
    selection = run.selection()
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
        stale = run.file(VALIDATION_FILE)
        if stale.is_file():
            stale.unlink()
    reporter(Log(f"selection set by hand: {chosen} (search chose {record['search_heads'] or '(none)'})"))
    return record


__all__ = ["evaluate_set", "release", "select"]
