"""`headedit eval MODEL --task T --split discovery|heldout`: accuracy, n and a 95% Wilson interval.

`--task` takes a built-in name (`headedit tasks` lists them), an lm-eval task YAML (`FILE.yaml[#metric[,filter]]`),
a task TOML over a JSONL/CSV file, or `lm-eval:NAME`. `--json` writes the results with their provenance (model id,
revision, dtype, device, task source with file hashes, seed, limit, versions, date); `--log-samples` writes one
JSON line per example (prompt, choices and scores or the generated text, target, correct).
"""
from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a model (optionally with heads ablated) on a task split")
    p.add_argument("model", help="local model folder or hub id")
    p.add_argument("--task", required=True,
                   help="a built-in task (see `headedit tasks`), an lm-eval task file FILE.yaml[#METRIC[,FILTER]], "
                        "a task .toml over a JSONL/CSV file, or lm-eval:NAME")
    p.add_argument("--split", choices=("discovery", "heldout"), default="heldout")
    p.add_argument("--limit", type=int, default=None, help="first N examples of the split, in order")
    p.add_argument("--heads", default="", help='heads to zero-ablate, e.g. "3.1,5.7"')
    p.add_argument("--json", dest="json_out", default=None,
                   help="write results (per-example correctness and provenance) here")
    p.add_argument("--log-samples", dest="samples_out", default=None, metavar="FILE",
                   help="write one JSON line per example: prompt, choices with scores or generated text, target, correct")
    p.add_argument("--data-dir", default=None, help="local data folder (default $HEADEDIT_DATA_DIR, else the hub)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto")
    p.add_argument("--revision", default=None)
    p.add_argument("--gguf-file", default=None, metavar="NAME", help="which .gguf of a folder holding several")
    p.add_argument("--chat", action="store_true", help="format prompts with the model's chat template")
    p.add_argument("--no-thinking", action="store_true", help="chat template argument enable_thinking=False")
    p.set_defaults(func=run)


def provenance(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """Which model, on what, with which software, when: enough to reproduce or compare a result."""
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.model.loading import resolve_model
    from headedit.tasks.source import package_versions

    try:
        source = resolve_model(args.model, args.revision, weights=False)
        commit = source.path.name if source.hub else None  # a hub snapshot folder is named by its commit
    except HeadeditError:
        commit = None
    param = next(model.parameters())
    return {
        "model": {"id": args.model, "revision": args.revision, "commit": commit,
                  "dtype": str(param.dtype).removeprefix("torch."), "device": str(param.device)},
        "versions": package_versions(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
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


def check_out_folder(path: str | None, option: str) -> None:
    """An output file's folder must exist before the model is loaded (bad input fails fast)."""
    if path and not Path(path).parent.is_dir():
        raise HeadeditError(f"{option}: folder {Path(path).parent} does not exist", f"create it or choose another {option} path")
    if path and Path(path).is_dir():
        raise HeadeditError(f"{option}: {path} is a folder, not a file", f"name a file, e.g. {option} {Path(path) / 'out.json'}")
    if path and not os.access(Path(path).parent, os.W_OK | os.X_OK):
        raise HeadeditError(f"{option}: cannot write in {Path(path).parent}", f"choose a writable {option} path")


def run(args: argparse.Namespace, console: Any) -> int:
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.commands.progress import reporter_for
    from headedit.model.loading import load_model
    from headedit.pipeline.evaluate import evaluate_loaded  # the library function (also headedit.evaluate)
    from headedit.tasks import get_task

    check_out_folder(args.json_out, "--json")
    check_out_folder(args.samples_out, "--log-samples")
    get_task(args.task)  # a bad task (file) fails before the model loads
    model, tokenizer, layout = load_model(args.model, dtype=args.dtype, device=args.device, revision=args.revision,
                                         gguf_file=args.gguf_file)
    kwargs = {"enable_thinking": False} if args.no_thinking else None
    with reporter_for(console) as reporter:
        result = evaluate_loaded(model, tokenizer, layout, args.task, args.split, args.limit, args.heads,
                                 args.data_dir, args.seed, args.batch_size, chat=args.chat or args.no_thinking,
                                 chat_template_kwargs=kwargs, log_samples=bool(args.samples_out), reporter=reporter)
    samples = result.pop("samples", None)
    lo, hi = result["ci95"]
    heads = result["heads"] or "none (intact)"
    console.print(f"{result['task']} {result['split']} ({result['source']}), heads ablated: {heads}")
    if result["note"]:
        console.print(f"note: {result['note']}")
    console.print(f"{result['metric']}: {100 * result['accuracy']:.2f}%  n={result['n']}  "
                  f"95% CI [{100 * lo:.2f}, {100 * hi:.2f}]", highlight=False)
    if args.json_out:
        result.update(provenance(args, model))
        write_atomic(Path(args.json_out), json.dumps(result, indent=2) + "\n")
    if args.samples_out and samples is not None:
        # lazy: the CLI starts, and reports bad input, without loading torch
        from headedit.tasks.samples import write_samples

        write_samples(Path(args.samples_out), samples)
        console.print(f"samples: {args.samples_out} ({len(samples)} records)")
    return 0
