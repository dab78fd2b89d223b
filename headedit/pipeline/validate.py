"""Held-out validation: the intact model vs the baked, reloaded checkpoint, paired per example.

The edited numbers come from the checkpoint a user would download (baked to a temporary export
and loaded back through the same loader), not from the in-memory hooks, so validation also proves
the export. Both arms and every side task are journaled (split `heldout`, `heldout:<task>`), which
is the first and only time discovery's run touches held-out examples.
"""
from __future__ import annotations

import gc
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from headedit.discovery.objective import effective, summary
from headedit.discovery.scorer import Cancelled
from headedit.engine.damage import measure as measure_damage
from headedit.engine.damage import no_damage
from headedit.engine.damage import reference as damage_reference
from headedit.events import Log, Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.export.bake import bake, read_manifest
from headedit.export.outgoing import checkpoint_record
from headedit.journal import Journal
from headedit.model.heads import format_heads, parse_heads
from headedit.pipeline.loaded import load_for, load_split
from headedit.pipeline.selectivity import removal_verdict, validation_task_names
from headedit.runs import VALIDATION_FILE, Run
from headedit.stats import format_p, paired_summary
from headedit.tasks import get_task
from headedit.tasks.source import task_source

STAGE = "validate"
CHUNK = 64  # examples per engine call, for progress and resumability


def _split_key(task_name: str, main: str) -> str:
    return "heldout" if task_name == main else f"heldout:{task_name}"


def verdict(row: dict[str, Any], alpha: float) -> tuple[bool, str]:
    """Plain words: did the gain hold on held-out?"""
    lo, hi = row["ci95_points"]
    gain = row["gain_points"]
    p = format_p(row["mcnemar_p"])
    level = round(100 * (1 - alpha))
    held = gain > 0 and lo > 0 and row["mcnemar_p"] < alpha
    numbers = f"{gain:+.1f} points, {level}% CI [{lo:.1f}, {hi:.1f}], McNemar {p}"
    if held:
        return True, f"gain held on held-out: {numbers}"
    if gain <= 0:
        return False, f"gain did not hold on held-out: {numbers} (no improvement)"
    return False, f"gain did not hold on held-out: {numbers} (not significant at {alpha:g})"


def _values(journal: Journal, split_key: str, heads_key: str) -> np.ndarray:
    """The objective values `_bits` journaled for this row (it always writes them for a continuous objective)."""
    entry = journal.get(split_key, heads_key)
    assert entry is not None and entry.values is not None
    return entry.values


def _bits(journal: Journal, engine: Any, task: Any, examples: list, split_key: str, heads_key: str, stage: str,
          tick: Callable[[int], None], cancel: threading.Event | None, objective: str = "accuracy") -> np.ndarray:
    """Correctness of the engine's model as loaded (no hooks: the edit is in the weights), journaled chunk by
    chunk under `heads_key`, so a cancelled validation resumes without redoing finished chunks. A continuous
    `objective` is journaled beside the bits (from the same forwards) for the report, never for the verdict."""
    n = len(examples)
    entry = journal.get(split_key, heads_key)
    if entry is not None and objective != "accuracy" and entry.values is None:
        entry = None  # a row from before objectives were journaled: evaluated again, with values
    bits = entry.bits[:n] if entry is not None else np.zeros(0, dtype=bool)
    values = entry.values[:n] if entry is not None and entry.values is not None else np.zeros(0, np.float32)
    tick(bits.size)
    while bits.size < n:
        if cancel is not None and cancel.is_set():
            raise Cancelled("validation cancelled; finished chunks are saved", "run `headedit validate RUN` again")
        stop = min(n, bits.size + CHUNK)
        got, vals = engine.evaluate(task, examples[bits.size:stop], [()], objective)
        new = np.asarray(got[0], dtype=bool)  # [stop - start]
        bits = np.concatenate([bits, new])
        values = np.concatenate([values, vals[0]])
        journal.put(split_key, heads_key, bits, stage, new_examples=new.size,
                    values=values if objective != "accuracy" else None)
        tick(new.size)
    return bits


def validate_run(run_dir: str | Path, reporter: Reporter = null_reporter, cancel: threading.Event | None = None) -> dict:
    """Held-out intact vs the reloaded baked checkpoint; writes and returns validation.json's content."""
    from headedit.engine.autobatch import resolve_batch  # torch-backed; loaded with the model

    run = Run.open(Path(run_dir))
    recipe = run.recipe()
    selection = run.selection()
    checkpoint = None
    with run.lock(), run.journal() as journal:
        for stale in run.path.glob(".validate-*"):  # a killed validation's temporary bake (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        loaded = load_for(recipe, reporter=reporter)
        heads = format_heads(parse_heads(str(selection.get("heads", "")), loaded.layout))
        tasks = [loaded.task] + [get_task(name) for name in validation_task_names(recipe)]  # side + retain tasks
        splits = {t.name: list(load_split(recipe, t, "heldout", recipe.task.heldout).examples) for t in tasks}
        # "auto" batch: the size probed during discovery (kept in run.json) for this device, else probe now
        resolve_batch(loaded.engine, recipe.model.batch_size, loaded.task, splits[loaded.task.name], run, reporter)
        total = sum(len(v) for v in splits.values()) * (2 if heads else 1)
        reporter(StageStarted(STAGE, total=total, description=f"held-out validation of {heads or '(no heads)'}"))
        done = [0]

        def tick(k: int) -> None:
            done[0] += k
            reporter(StageProgress(STAGE, done[0], total))

        objective = effective(recipe.discovery.objective, loaded.task.kind)  # reported beside accuracy
        intact = {t.name: _bits(journal, loaded.engine, t, splits[t.name], _split_key(t.name, tasks[0].name), "",
                                "validate:intact", tick, cancel, objective if t is tasks[0] else "accuracy")
                  for t in tasks}
        # general damage: the intact model's next-token predictions on neutral text, compared after the bake
        neutral = damage_reference(loaded.model, loaded.tokenizer) if heads else None
        if heads:
            del loaded
            gc.collect()
            tmp = Path(tempfile.mkdtemp(prefix=".validate-", dir=run.path))
            try:
                baked = bake(recipe.model.id, heads, tmp / "model", revision=recipe.model.revision)
                checkpoint = checkpoint_record(read_manifest(baked))  # what this validation vouches for
                reporter(Log(f"baked {heads} into a temporary export; reloading it"))
                edited_model = load_for(recipe, model_id=str(baked), reporter=reporter)
                resolve_batch(edited_model.engine, recipe.model.batch_size, edited_model.task,
                              splits[edited_model.task.name], run, reporter)
                edited = {t.name: _bits(journal, edited_model.engine, t, splits[t.name],
                                        _split_key(t.name, tasks[0].name), heads, "validate:baked", tick, cancel,
                                        objective if t is tasks[0] else "accuracy")
                          for t in tasks}
                assert neutral is not None  # measured above whenever heads is set
                damage = measure_damage(neutral, edited_model.model, edited_model.tokenizer)
                del edited_model
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            edited = intact
            damage = no_damage()
        main_key = _split_key(tasks[0].name, tasks[0].name)
        objective_report = None if objective == "accuracy" else summary(
            objective, _values(journal, main_key, ""), _values(journal, main_key, heads))
    alpha = recipe.validation.alpha
    rows = []
    for t in tasks:
        row = {"task": t.name, "dataset_id": t.dataset_id, "metric": t.metric}
        row.update(paired_summary(intact[t.name], edited[t.name], seed=recipe.task.seed,
                                  n_boot=recipe.validation.bootstrap, level=1 - alpha))
        rows.append(row)
    main = rows[0]
    passed, text = verdict(main, alpha) if heads else (False, "no heads were selected: nothing to validate")
    removal = removal_verdict(recipe, rows, alpha) if heads else None  # direction = "remove": its own verdict
    if removal is not None:
        passed, text = removal.passed, removal.text
    result = {
        "task": main["task"], "dataset_id": main["dataset_id"], "split": "heldout", "metric": main["metric"],
        "n": main["n"], "heads": heads, "intact_acc": main["intact_acc"], "edited_acc": main["edited_acc"],
        "gain_points": main["gain_points"], "relative_error_reduction": main["relative_error_reduction"],
        "ci95_points": main["ci95_points"], "mcnemar_p": main["mcnemar_p"], "passed": passed, "verdict": text,
        "edited_source": "baked checkpoint, reloaded" if heads else "intact",
        **({"checkpoint": checkpoint} if checkpoint is not None else {}),
        **({"objective": objective_report} if objective_report is not None else {}),
        "damage": damage,
        "task_source": task_source(tasks[0]),  # file name + sha256 of a task file (never its folder), or built-in
        "side_tasks": [{k: v for k, v in r.items() if k != "relative_error_reduction"} for r in rows[1:]],
        **(removal.fields if removal is not None else {}),
    }
    run.write(VALIDATION_FILE, result)
    reporter(StageFinished(STAGE, text))
    return result
