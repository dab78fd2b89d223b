"""`headedit eval MODEL --task T --split discovery|heldout`: accuracy, n and a 95% Wilson interval."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError
from headedit.model.heads import format_heads, parse_heads


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a model (optionally with heads ablated) on a task split")
    p.add_argument("model", help="local model folder or hub id")
    p.add_argument("--task", required=True, help="arithmetic, boolq, hellaswag, mbpp, gsm8k")
    p.add_argument("--split", choices=("discovery", "heldout"), default="heldout")
    p.add_argument("--limit", type=int, default=None, help="first N examples of the split, in order")
    p.add_argument("--heads", default="", help='heads to zero-ablate, e.g. "3.1,5.7"')
    p.add_argument("--json", dest="json_out", default=None, help="write results (with per-example correctness) here")
    p.add_argument("--data-dir", default=None, help="local data folder (default $HEADEDIT_DATA_DIR, else the hub)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto")
    p.add_argument("--revision", default=None)
    p.add_argument("--chat", action="store_true", help="format prompts with the model's chat template")
    p.add_argument("--no-thinking", action="store_true", help="chat template argument enable_thinking=False")
    p.set_defaults(func=run)


def evaluate(
    model: Any, tokenizer: Any, layout: Any, task_name: str, split: str, limit: int | None = None,
    heads: str = "", data_dir: str | None = None, seed: int = 0, batch_size: int = 16,
    chat: bool = False, chat_template_kwargs: dict | None = None,
) -> dict[str, Any]:
    """The numbers `headedit eval` prints and writes."""
    from headedit.engine.core import Engine
    from headedit.stats import wilson_interval
    from headedit.tasks import get_task

    if limit is not None and limit < 1:
        raise HeadeditError(f"--limit must be at least 1, got {limit}", "e.g. --limit 100")
    if batch_size < 1:
        raise HeadeditError(f"--batch-size must be at least 1, got {batch_size}", "e.g. --batch-size 16")
    head_set = parse_heads(heads, layout)
    task = get_task(task_name)
    loaded = task.load(split, None, seed, Path(data_dir) if data_dir else None)  # type: ignore[arg-type]
    examples = list(loaded.examples)[:limit] if limit else list(loaded.examples)
    engine = Engine(model, tokenizer, layout, batch_size=batch_size, chat=chat, chat_template_kwargs=chat_template_kwargs)
    correct = engine.correctness(task, examples, [head_set])[0]
    n, k = len(examples), int(correct.sum())
    lo, hi = wilson_interval(k, n)
    lo, hi = min(lo, k / n if n else 0.0), max(hi, k / n if n else 1.0)  # float rounding at 0 and 1
    return {
        "task": task.name, "dataset_id": task.dataset_id, "split": split, "metric": task.metric,
        "heads": format_heads(head_set), "n": n, "correct": k, "accuracy": k / n if n else 0.0,
        "ci95": [lo, hi], "source": loaded.source, "note": loaded.note,
        "examples": [{"index": ex.index, "correct": bool(c)} for ex, c in zip(examples, correct)],
    }


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same folder, then rename: a reader never sees half a file."""
    if path.parent and not path.parent.is_dir():
        raise HeadeditError(f"folder {path.parent} does not exist", "create it or choose another --json path")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def run(args: argparse.Namespace, console: Any) -> int:
    from headedit.model.loading import load_model

    model, tokenizer, layout = load_model(args.model, dtype=args.dtype, device=args.device, revision=args.revision)
    kwargs = {"enable_thinking": False} if args.no_thinking else None
    result = evaluate(model, tokenizer, layout, args.task, args.split, args.limit, args.heads, args.data_dir,
                      args.seed, args.batch_size, chat=args.chat or args.no_thinking, chat_template_kwargs=kwargs)
    lo, hi = result["ci95"]
    heads = result["heads"] or "none (intact)"
    console.print(f"{result['task']} {result['split']} ({result['source']}), heads ablated: {heads}")
    if result["note"]:
        console.print(f"note: {result['note']}")
    console.print(f"{result['metric']}: {100 * result['accuracy']:.2f}%  n={result['n']}  "
                  f"95% CI [{100 * lo:.2f}, {100 * hi:.2f}]", highlight=False)
    if args.json_out:
        write_atomic(Path(args.json_out), json.dumps(result, indent=2) + "\n")
    return 0
