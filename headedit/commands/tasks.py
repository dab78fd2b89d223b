"""`headedit tasks [TASK]`: the built-in tasks, or what one task (file) is and what its first example looks like."""
from __future__ import annotations

import argparse
import json
from typing import Any

PREVIEW_CHARS = 400  # of a preview prompt, shown from its end (where the question is)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tasks", help="list built-in tasks, or describe a task or task file")
    p.add_argument("task", nargs="?", default=None,
                   help="a task name, an lm-eval task file FILE.yaml[#METRIC[,FILTER]], a task .toml, or lm-eval:NAME")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def builtin_rows() -> list[dict[str, Any]]:
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.tasks import get_task, task_names

    rows = []
    for name in task_names():
        task = get_task(name)
        rows.append({"name": name, "kind": task.kind, "metric": task.metric, "dataset": task.dataset_id,
                     "discovery": task.default_sizes[0], "heldout": task.default_sizes[1]})
    return rows


def describe(reference: str) -> dict[str, Any]:
    """describe() of the task, its source (files and hashes) and, for task files, the first example."""
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit.tasks import get_task
    from headedit.tasks.source import task_source

    task = get_task(reference)
    info: dict[str, Any] = {**task.describe(), "default_sizes": list(task.default_sizes), "source": task_source(task)}
    preview = getattr(task, "preview", None)
    if callable(preview):
        ex = preview()
        info["first_example"] = {"index": ex.index, "prompt": ex.prompt,
                                 **({"choices": list(ex.choices), "label": ex.label} if ex.choices else {}),
                                 **({"target": ex.target} if ex.target is not None else {}),
                                 **({"reference": str(ex.meta["target"])} if "target" in ex.meta else {})}
    return info


def run(args: argparse.Namespace, console: Any) -> int:
    if args.task is None:
        rows = builtin_rows()
        if args.json:
            console.print_json(json.dumps(rows))
            return 0
        from rich.table import Table

        table = Table(title="built-in tasks")
        for col in ("name", "kind", "metric", "dataset", "discovery", "heldout"):
            table.add_column(col, justify="right" if col in ("discovery", "heldout") else "left")
        for r in rows:
            table.add_row(r["name"], r["kind"], r["metric"], r["dataset"] or "-", str(r["discovery"]), str(r["heldout"]))
        console.print(table)
        console.print("Your own task: `--task FILE.yaml` (an lm-eval task file, `pip install 'headedit[lmeval]'`) or "
                      "`--task FILE.toml` (a JSONL/CSV file with a prompt template); `headedit tasks FILE` describes "
                      "it. See README, \"Your own task\".", markup=False, highlight=False)
        return 0
    info = describe(args.task)
    if args.json:
        console.print_json(json.dumps(info, default=str))
        return 0
    for line in describe_lines(info):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def describe_lines(info: dict[str, Any]) -> list[str]:
    source = info["source"]
    lines = [f"task: {source['reference']} ({source['kind']})"]
    if "task_file" in source:
        lines.append(f"task file: {source['task_file']['file']} sha256 {source['task_file']['sha256']}")
    for entry in source.get("files", []):
        lines.append(f"  uses: {entry['file']} sha256 {entry['sha256']}")
    for entry in source.get("data", []):
        lines.append(f"data: {entry['file']} sha256 {entry['sha256']}")
    if "lm_eval_task" in info:
        lines.append(f"lm-eval task: {info['lm_eval_task']} ({info['output_type']}, lm-eval "
                     f"{source.get('lm_eval_version')}), headedit kind {info['kind']}")
        lines.append(f"metric: {info['metric']} of {', '.join(info['metrics'])}; filter: {info['filter']} of "
                     f"{', '.join(info['filters'])} (choose with FILE#METRIC,FILTER)")
        lines.append(f"few-shot: {info['num_fewshot']} (seed {source.get('fewshot_seed')})")
        if info.get("until") is not None:
            lines.append(f"generation: greedy, until {info['until']}, max_gen_toks {info['max_gen_toks']}")
        train = info.get("training_split")
        split = f"held-out: {info['eval_split']} ({info['eval_documents']} documents)"
        lines.append(split + (f"; discovery: {train} ({info['training_documents']} documents)" if train else
                              "; no training split: discovery and held-out carved from it by a seeded shuffle"))
    else:
        lines.append(f"kind: {info['kind']}; metric: {info['metric']}; dataset: {info.get('dataset_id') or '-'}")
        if "rows" in info:
            lines.append(f"rows: {info['rows']} (one file: discovery and held-out carved by a seeded shuffle)")
    lines.append(f"default sizes: discovery {info['default_sizes'][0]}, held-out {info['default_sizes'][1]}")
    ex = info.get("first_example")
    if ex:
        prompt = ex["prompt"]
        shown = prompt if len(prompt) <= PREVIEW_CHARS else "..." + prompt[-PREVIEW_CHARS:]
        lines.append(f"first example (index {ex['index']}), prompt:")
        lines.extend("  | " + line for line in shown.split("\n"))
        if "choices" in ex:
            lines.append("choices: " + ", ".join(repr(c) for c in ex["choices"]) + f"; correct: {ex['label']}")
        if "target" in ex:
            lines.append(f"target: {ex['target']!r}")
        if "reference" in ex:
            lines.append(f"reference: {ex['reference'][:200]!r}")
    return lines
