"""Per-example records of one evaluation, like lm-eval's `--log_samples`: what the model saw and answered.

One record per example: its `index` (row of the source split), the prompt (or, above `PROMPT_LIMIT` characters,
its sha256 and length), then by kind
- choice: every choice with its summed log-likelihood (and the normalised score acc_norm compares), the
  predicted and the correct choice;
- exact: the target, its summed log-likelihood and whether every target token is the greedy one;
- generate: the greedy text under the evaluated head set (for lm-eval tasks also the filtered answer the
  metric compared) and the reference;
and `correct`, the engine's verdict, which the records never recompute.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headedit.tasks.base import Example, Task

if TYPE_CHECKING:  # torch-backed; the caller has an engine already
    from headedit.engine.core import Engine
    from headedit.model.heads import Head

PROMPT_LIMIT = 2000  # characters of prompt kept verbatim in a record


def prompt_fields(prompt: str) -> dict[str, Any]:
    if len(prompt) <= PROMPT_LIMIT:
        return {"prompt": prompt}
    return {"prompt_sha256": hashlib.sha256(prompt.encode("utf-8")).hexdigest(), "prompt_chars": len(prompt)}


def jsonable(value: Any) -> Any:
    """A filtered answer as JSON (lm-eval filters may return tuples or other plain containers)."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def logprob_totals(engine: Engine, task: Task, examples: Sequence[Example],
                   head_set: tuple[Head, ...]) -> tuple[list[dict[int, float]], list[bool]]:
    """Per example: summed log-likelihood of each continuation group, and whether every token was the argmax."""
    plans = engine.plans(task, examples)
    raw = engine.score_plans(plans, [head_set])[0]
    totals: list[dict[int, float]] = [defaultdict(float) for _ in examples]
    greedy = [True] * len(examples)
    for batch, scores in raw:
        tokens = batch.gather_tok_host
        for i, member in enumerate(batch.gather_member):
            totals[member][batch.gather_group[i]] += float(scores.logprob[i])
            if tokens is not None and scores.argmax[i] != tokens[i]:
                greedy[member] = False
    return totals, greedy


def generations(engine: Engine, task: Task, examples: Sequence[Example], head_set: tuple[Head, ...]) -> list[str]:
    """Greedy texts under the head set: the engine's cached drafts when intact, plain generation when ablated."""
    # lazy: torch-backed, loaded only when a model is
    from headedit.engine.generate import finish_text, get_drafts, greedy_generate
    from headedit.model.ablation import ablate

    if not head_set:
        return [d.text for d in get_drafts(engine, task, list(examples))]
    out = []
    with ablate(engine.model, engine.layout, heads=head_set):
        for ex in examples:
            ids = engine.plan(task, ex)[0].tokens
            tokens = greedy_generate(engine.model, engine.tokenizer, ids, task.max_new_tokens, task.stop)
            out.append(finish_text(engine.tokenizer, tokens, task.stop))
    return out


def sample_records(engine: Engine, task: Task, examples: Sequence[Example], head_set: tuple[Head, ...],
                   correct: Sequence[bool]) -> list[dict[str, Any]]:
    """One JSON-ready record per example (see the module docstring)."""
    records = [{"index": ex.index, **prompt_fields(ex.prompt)} for ex in examples]
    if task.kind == "generate":
        texts = generations(engine, task, examples, head_set)
        filtered = getattr(task, "filtered", None)
        for rec, ex, text in zip(records, examples, texts):
            rec["generated"] = text
            if callable(filtered):
                rec["filtered"] = jsonable(filtered(ex, text))
            reference = ex.meta.get("target", ex.meta.get("reference", ex.target))
            if reference is not None:
                rec["target"] = jsonable(reference)
    else:
        totals, greedy = logprob_totals(engine, task, examples, head_set)
        for rec, ex, total, is_greedy in zip(records, examples, totals, greedy):
            if task.kind == "exact":
                rec.update(target=ex.target, logprob=total[0], greedy=is_greedy)
                continue
            lengths = ex.meta.get("choice_lengths") or [len(c.encode("utf-8")) for c in ex.choices]
            scores = [total[k] for k in range(len(ex.choices))]
            normed = [s / max(1, n) for s, n in zip(scores, lengths)] if task.length_normalize else scores
            rec["choices"] = [{"text": c, "logprob": s, **({"normalized": v} if task.length_normalize else {})}
                              for c, s, v in zip(ex.choices, scores, normed)]
            rec["pred"] = max(range(len(normed)), key=lambda k: (normed[k], -k))
            rec["label"] = ex.label
            rec["target"] = ex.choices[ex.label] if ex.label is not None and 0 <= ex.label < len(ex.choices) else None
    for rec, ok in zip(records, correct):
        rec["correct"] = bool(ok)
    return records


def write_samples(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """JSON lines, written whole or not at all (temp file, then rename)."""
    # lazy: loaded on first use
    from headedit.atomic import write_bytes_atomic

    text = "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)
    write_bytes_atomic(path, text.encode("utf-8"))
