"""Accuracy of a model (optionally with heads zeroed) on a task split: what `headedit eval` prints and
`headedit.evaluate` returns.

The split is scored in chunks of CHUNK examples (batches never straddle a chunk, so the result does not depend on
how it is chunked) and each chunk is reported as a `StageProgress` event, so a notebook or log shows how far it is.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError, TaskError
from headedit.events import Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.model.heads import format_heads, parse_heads

STAGE = "eval"
CHUNK = 256  # examples per engine call: one progress event each


def evaluate_loaded(
    model: Any, tokenizer: Any, layout: Any, task_name: str, split: str, limit: int | None = None,
    heads: str = "", data_dir: str | Path | None = None, seed: int = 0, batch_size: int = 16,
    chat: bool = False, chat_template_kwargs: dict | None = None, log_samples: bool = False,
    reporter: Reporter = null_reporter,
) -> dict[str, Any]:
    """Score a loaded model on the first `limit` examples of `split` (with `log_samples`, also `samples`: one
    record per example); accuracy with its 95% Wilson interval and per-example correctness."""
    import numpy as np

    from headedit.engine.core import Engine  # torch-backed: the model is already loaded when this runs
    from headedit.stats import wilson_interval
    from headedit.tasks import get_task
    from headedit.tasks.source import task_source

    if limit is not None and limit < 1:
        raise HeadeditError(f"--limit must be at least 1, got {limit}", "e.g. --limit 100")
    if batch_size < 1:
        raise HeadeditError(f"--batch-size must be at least 1, got {batch_size}", "e.g. --batch-size 16")
    head_set = parse_heads(heads, layout)
    task = get_task(task_name)
    loaded = task.load(split, None, seed, Path(data_dir) if data_dir else None)  # type: ignore[arg-type]
    examples = list(loaded.examples)[:limit] if limit else list(loaded.examples)
    if not examples:
        raise TaskError(f"the {split} split of {task.name} has no examples ({loaded.source})",
                        "check the data file or folder the task reads")
    engine = Engine(model, tokenizer, layout, batch_size=batch_size, chat=chat, chat_template_kwargs=chat_template_kwargs)
    n = len(examples)
    reporter(StageStarted(STAGE, total=n, description=f"{task.name} {split}, heads {format_heads(head_set) or 'none'}"))
    parts = []
    for start in range(0, n, CHUNK):
        chunk = examples[start:start + CHUNK]
        parts.append(engine.correctness(task, chunk, [head_set], offset=start, block=CHUNK)[0])  # [len(chunk)]
        reporter(StageProgress(STAGE, start + len(chunk), n))
    correct = np.concatenate(parts)  # [n]
    k = int(correct.sum())
    lo, hi = wilson_interval(k, n)
    lo, hi = min(lo, k / n), max(hi, k / n)  # float rounding at 0 and 1
    reporter(StageFinished(STAGE, f"{100 * k / n:.2f}% of {n}"))
    result: dict[str, Any] = {
        "task": task.name, "dataset_id": task.dataset_id, "split": split, "metric": task.metric,
        "heads": format_heads(head_set), "n": n, "correct": k, "accuracy": k / n,
        "ci95": [lo, hi], "source": loaded.source, "note": loaded.note, "task_source": task_source(task),
        "seed": seed, "limit": limit,
        "examples": [{"index": ex.index, "correct": bool(c)} for ex, c in zip(examples, correct, strict=True)],
    }
    if log_samples:
        # lazy: the task registry (and the task files it may build) loads on first use
        from headedit.tasks.samples import sample_records

        result["samples"] = sample_records(engine, task, examples, head_set, [bool(c) for c in correct])
    return result


def evaluate(
    model: Any, task: str, heads: str = "", split: str = "heldout", n: int | None = None, *,
    tokenizer: Any = None, data_dir: str | Path | None = None, seed: int = 0, batch_size: int = 16,
    dtype: str = "float32", device: str = "cpu", revision: str | None = None, chat: bool = False,
    progress: Reporter | None = None,
) -> dict[str, Any]:
    """Accuracy of `model` on the first `n` examples of a task split, with `heads` zeroed by forward hooks.

    `model` is a model folder, a Hub id or `headedit:demo` (loaded here), or an already loaded transformers
    model (then pass its `tokenizer`). `progress` receives the typed events of `headedit.events`.
    """
    # lazy: torch-backed, loaded only when a model is
    from headedit.model.heads import HeadLayout
    from headedit.model.loading import load_model

    if isinstance(model, (str, Path)):
        model, tokenizer, layout = load_model(str(model), dtype=dtype, device=device, revision=revision)
    else:
        if tokenizer is None:
            raise HeadeditError("evaluate() of a loaded model needs its tokenizer", "pass tokenizer=...")
        layout = HeadLayout.from_model(model)
    return evaluate_loaded(model, tokenizer, layout, task, split, n, heads, data_dir, seed, batch_size, chat=chat,
                           reporter=progress or null_reporter)


__all__ = ["evaluate", "evaluate_loaded", "CHUNK"]
