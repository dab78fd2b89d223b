"""What every stage needs from a recipe or a run folder: its model, engine, task and splits, loaded once.

Also the checks that run before a run folder exists, and the creation/reopening of that folder, so single- and
multi-process discovery start the same way.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from headedit import __version__
from headedit.atomic import check_target, sha256_file
from headedit.discovery.early_stop import EarlyStop
from headedit.discovery.scorer import EvalFn, ScoreJournal, Scorer
from headedit.errors import RecipeError, RunError, TaskError
from headedit.events import Log, Reporter, null_reporter
from headedit.model.files import check_vocab
from headedit.model.heads import Head, HeadLayout
from headedit.model.loading import (
    check_remote_code,
    check_shapes,
    load_tokenizer,
    resolve_model,
    source_config,
    source_weight_files,
)
from headedit.pipeline.parallel import Placement, Shard, placement_for
from headedit.recipe import Recipe
from headedit.runs import Run, default_run_dir, environment, weight_hashes
from headedit.tasks import Split, Task, get_task
from headedit.tasks.base import SplitName

if TYPE_CHECKING:  # torch-backed types; the modules are imported when a model is loaded
    from headedit.engine.core import Engine

DISCOVERY: SplitName = "discovery"
HELDOUT: SplitName = "heldout"
SETS_PER_CALL = 16  # head sets per engine call (and per journal commit)


@dataclass
class Loaded:
    """A recipe's model, engine and task, loaded once per stage."""

    recipe: Recipe
    model: Any  # a transformers PreTrainedModel (typed loosely: torch stays out of import time)
    tokenizer: Any  # a transformers tokenizer
    layout: HeadLayout
    engine: Engine
    task: Task


def load_for(recipe: Recipe, model_id: str | None = None, reporter: Reporter = null_reporter,
             placement: Placement | None = None) -> Loaded:
    """Load the recipe's model (or `model_id`, e.g. a baked export) with an engine for its task.

    `placement` says where: default from the recipe's device and max_memory, and under torchrun this
    process's GPU (or GPU slice).
    """
    # torch-backed: imported here so `headedit.pipeline` can be imported (and recipes checked) without torch
    from headedit.engine.core import Engine
    from headedit.model.loading import load_model

    m = recipe.model
    where = placement or placement_for(m)
    reporter(Log(f"loading model {model_id or m.id} on {where.device}"
                 + (f" (device_map over {dict(where.max_memory or {})})" if where.device_map else "")))
    model, tokenizer, layout = load_model(
        model_id or m.id, dtype=m.dtype, device=where.device, revision=None if model_id else m.revision,
        trust_remote_code=m.trust_remote_code, device_map=where.device_map,
        max_memory=dict(where.max_memory) if where.max_memory else None,
        gguf_file=None if model_id else m.gguf_file,
    )
    batch = 16 if m.batch_size == "auto" else int(m.batch_size)
    engine = Engine(model, tokenizer, layout, batch_size=batch,
                    chat_template_kwargs=dict(m.chat_template_kwargs) or None, chat=recipe.task.chat)
    return Loaded(recipe, model, tokenizer, layout, engine, get_task(recipe.task.name))


def load_split(recipe: Recipe, task: Task, split: SplitName, size: int | None = None) -> Split:
    """A task split of the recipe's size; a short split is an error (sizes larger than the data)."""
    want = size if size is not None else (recipe.task.discovery if split == DISCOVERY else recipe.task.heldout)
    data_dir = Path(recipe.task.data_dir) if recipe.task.data_dir is not None else None
    data = task.load(split, size=want, seed=recipe.task.seed, data_dir=data_dir)
    if len(data) < want:
        raise TaskError(f"task {task.name} has only {len(data)} {split} examples, recipe asks for {want}",
                        f"lower task.{split if split == DISCOVERY else 'heldout'} in the recipe")
    return data


def scorer_for(loaded: Loaded, journal: ScoreJournal, split_name: str, examples: Sequence[Any], reporter: Reporter,
               cancel: threading.Event | None, shard: Shard | None = None, objective: str = "accuracy") -> Scorer:
    """The journaled scorer; with a `Shard`, each call's sets are split over the processes. A continuous
    `objective` (headedit.discovery.objective) is computed from the same forwards and journaled with the bits."""

    def eval_fn(sets: list[tuple[Head, ...]], start: int, stop: int):
        if objective == "accuracy":
            return loaded.engine.correctness(loaded.task, examples[start:stop], sets)
        return loaded.engine.evaluate(loaded.task, examples[start:stop], sets, objective)

    if shard is not None:  # SETS_PER_CALL per process; cancel is checked collectively inside the shard
        return Scorer(journal, split_name, len(examples), shard.wrap(eval_fn, objective != "accuracy"), reporter,
                      SETS_PER_CALL * shard.world_size, None, objective=objective)
    fn: EvalFn = eval_fn
    return Scorer(journal, split_name, len(examples), fn, reporter, SETS_PER_CALL, cancel, objective=objective)


def early_stop_for(recipe: Recipe, n: int) -> EarlyStop | None:
    if not recipe.discovery.early_stop:
        return None
    chunk = max(16, math.ceil(n / 16))
    return EarlyStop(chunk=chunk, alpha=recipe.discovery.early_stop_alpha, min_n=chunk)


def run_info(recipe: Recipe) -> dict[str, Any]:
    """run.json's first record: versions, model identity (weight hashes), task and split sizes."""
    source = resolve_model(recipe.model.id, recipe.model.revision, gguf_file=recipe.model.gguf_file)
    revision = recipe.model.revision or (source.path.name if source.hub else None)
    hashes = {source.gguf.name: sha256_file(source.gguf)} if source.gguf is not None else weight_hashes(source.path)
    return {
        "headedit_version": __version__, "name": recipe.name,
        "model": {"id": recipe.model.id, "revision": revision, "sha256": hashes,
                  "format": "gguf" if source.gguf is not None else "safetensors"},
        "environment": environment(),
        "task": {"name": recipe.task.name, "discovery_n": recipe.task.discovery, "heldout_n": recipe.task.heldout,
                 "seed": recipe.task.seed, "data_note": ""},
    }


def preflight(recipe: Recipe) -> None:
    """Every check that can fail before a run folder exists (a refused run leaves nothing behind): the model's
    config, weights, tokenizer (and chat template when task.chat), the device, the task's data and sizes, and the
    recipe's export folder (a place no export can ever be written, like "/", fails now, not after validation)."""
    source = resolve_model(recipe.model.id, recipe.model.revision, gguf_file=recipe.model.gguf_file)
    config = source_config(source)
    check_remote_code(config, recipe.model.trust_remote_code)
    files = source_weight_files(source)
    check_shapes(HeadLayout.from_config(config), files)
    check_vocab(config, files)
    check_device(recipe.model.device)
    load_tokenizer(source, recipe.model.trust_remote_code, chat=recipe.task.chat)
    if recipe.export.out:
        check_target(Path(recipe.export.out), force=True, protect=(source.path,))
    task = get_task(recipe.task.name)
    for split in (DISCOVERY, HELDOUT):  # sizes larger than the data fail now, not after discovery
        if len(load_split(recipe, task, split)) == 0:
            raise TaskError(f"task {task.name} has no {split} examples", "check the task's data")


def check_device(device: str) -> None:
    """The recipe's device exists on this machine (`cuda:99` on a 1-GPU machine is refused before any work)."""
    if device in ("auto", "cpu"):
        return
    import torch  # only for a GPU device; discovery imports it next anyway

    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise RecipeError(f"model.device = {device!r}, but this machine has {count} CUDA device(s)",
                              'set model.device = "auto" (or "cpu", or an index below the count)')
    elif device == "mps" and not torch.backends.mps.is_available():
        raise RecipeError('model.device = "mps", but MPS is not available here', 'set model.device = "auto" or "cpu"')


def open_or_create_run(recipe: Recipe | None, run_dir: str | Path | None, resume: bool) -> tuple[Run, Recipe]:
    """(run, recipe): the run to resume with its own recipe, or a new run folder after every cheap check."""
    if resume:
        if run_dir is None:
            raise RunError("--resume needs the run folder", "headedit discover --resume RUN")
        run = Run.open(Path(run_dir))
        return run, run.recipe()
    if recipe is None or not getattr(recipe, "source_text", ""):
        raise RecipeError("discover needs a recipe loaded from TOML text", "use load_recipe(path)")
    preflight(recipe)
    run = Run.create(Path(run_dir) if run_dir else default_run_dir(recipe.name), recipe.source_text,
                     run_info(recipe))
    return run, recipe
