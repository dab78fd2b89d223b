"""More held-out rows for a validated run: the intact model and the run's selected heads on held-out rows beyond
the ones `headedit validate` used, pooled with them. For when a validation's interval is too wide to decide.

    OMP_NUM_THREADS=1 python scripts/extend_heldout.py runs/RUN --rows 4000 --shard 0/2 &
    OMP_NUM_THREADS=1 python scripts/extend_heldout.py runs/RUN --rows 4000 --shard 1/2 &
    wait; python scripts/extend_heldout.py runs/RUN --rows 4000 --report docs/measurements/NAME.json

The new rows come from the same seeded held-out split (the recipe's seed), none of them among the validated rows
(nor, like every held-out row, in discovery), evaluated with hook ablation, which gives exactly the baked checkpoint's logits
(tests/test_real_model.py); the first rows of each shard are also compared with the validation's journaled bits.
Each shard saves `extend-<i>of<k>.npz` (with `--range A:B`, `extend-rA-B.npz`) in the run folder after every
chunk and resumes from it; the report refuses parts that overlap. The report pools
validation rows and new rows: accuracy, paired-bootstrap 95% interval, exact McNemar, and the objective's paired
t interval (headedit.stats / headedit.discovery.objective, as `validate` computes them).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from headedit.discovery.objective import effective, summary
from headedit.journal import Journal
from headedit.model.heads import parse_heads
from headedit.pipeline.loaded import HELDOUT, load_for, load_split
from headedit.runs import Run
from headedit.stats import discordant, paired_summary

CHECK_ROWS = 32  # validated rows re-evaluated per shard: hooks must reproduce the baked checkpoint's bits


def validated(run: Run) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(heads, intact bits, edited bits, intact values, edited values) of the run's held-out validation."""
    heads = str(run.read("validation.json")["heads"])
    with Journal(run.file("journal.sqlite")) as journal:
        intact, edited = journal.get("heldout", ""), journal.get("heldout", heads)
    assert intact is not None and edited is not None and intact.values is not None and edited.values is not None
    return heads, intact.bits, edited.bits, intact.values, edited.values


def shard_rows(first: int, total: int, shard: int, shards: int) -> range:
    per = -(-(total - first) // shards)  # ceil
    return range(first + shard * per, min(total, first + (shard + 1) * per))


def evaluate(run: Run, rows: int, shard: int, shards: int, chunk: int, span: range | None = None) -> None:
    import torch

    torch.set_num_threads(1)
    recipe = run.recipe()
    heads, bits0, bits1, _, _ = validated(run)
    n_valid = bits0.size
    loaded = load_for(recipe)
    objective = effective(recipe.discovery.objective, loaded.task.kind)
    first = list(load_split(recipe, loaded.task, HELDOUT, size=n_valid).examples)
    seen = {e.index for e in first}
    # a larger held-out sample is not an extension of a smaller one: new rows = the larger one's rows not validated
    pool = load_split(recipe, loaded.task, HELDOUT, size=rows + n_valid).examples
    fresh = [e for e in pool if e.index not in seen][: rows - n_valid]
    assert len(fresh) == rows - n_valid, f"the held-out split has only {len(fresh)} rows beyond the validated ones"
    examples = first + fresh  # [validated rows, then new rows]: positions n_valid.. are what the shards evaluate
    sets = [(), parse_heads(heads)]
    check = loaded.engine.evaluate(loaded.task, first[shard * CHECK_ROWS:(shard + 1) * CHECK_ROWS], sets, objective)[0]
    checked = slice(shard * CHECK_ROWS, (shard + 1) * CHECK_ROWS)
    assert np.array_equal(check[0], bits0[checked]) and np.array_equal(check[1], bits1[checked]), "hooks != baked bits"
    want = span if span is not None else shard_rows(n_valid, rows, shard, shards)
    path = run.file(f"extend-r{want.start}-{want.stop}.npz" if span is not None else f"extend-{shard}of{shards}.npz")
    done = dict(np.load(path)) if path.is_file() else {"index": np.zeros(0, np.int64),
                                                         "bits": np.zeros((2, 0), bool),
                                                         "values": np.zeros((2, 0), np.float32)}
    start, cpu = want.start + done["index"].size, time.process_time()
    while start < want.stop:
        stop = min(want.stop, start + chunk)
        bits, values = loaded.engine.evaluate(loaded.task, examples[start:stop], sets, objective)
        done = {"index": np.concatenate([done["index"], [e.index for e in examples[start:stop]]]),
                "bits": np.concatenate([done["bits"], bits], axis=1),
                "values": np.concatenate([done["values"], values], axis=1)}
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **done)
        tmp.replace(path)
        print(f"shard {shard}: rows {want.start}-{stop} of {want.stop} ({time.process_time() - cpu:.0f} s CPU)",
              flush=True)
        start = stop


def report(run: Run, rows: int, out: Path | None) -> dict:
    recipe = run.recipe()
    heads, bits0, bits1, vals0, vals1 = validated(run)
    parts = sorted(run.path.glob("extend-*.npz"))
    new = [dict(np.load(p)) for p in parts]
    index = np.concatenate([p["index"] for p in new])
    assert np.unique(index).size == index.size, "two parts hold the same row"
    extra_bits = np.concatenate([p["bits"] for p in new], axis=1)  # [2, rows]
    extra_vals = np.concatenate([p["values"] for p in new], axis=1)
    assert bits0.size + extra_bits.shape[1] == rows, f"only {bits0.size + extra_bits.shape[1]} of {rows} rows done"
    a, b = np.concatenate([bits0, extra_bits[0]]), np.concatenate([bits1, extra_bits[1]])
    objective = effective(recipe.discovery.objective, "choice")
    result = {"run": run.path.name, "heads": heads, "task": recipe.task.name, "rows": rows,
              "validated_rows": int(bits0.size), "new_rows": int(extra_bits.shape[1]),
              "pooled": paired_summary(a, b), "fixed_broken": discordant(a, b),
              "new_only": paired_summary(extra_bits[0], extra_bits[1]),
              "objective_pooled": summary(objective, np.concatenate([vals0, extra_vals[0]]),
                                          np.concatenate([vals1, extra_vals[1]]))}
    print(json.dumps(result, indent=1))
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--rows", type=int, required=True, help="held-out rows in all, validated ones included")
    ap.add_argument("--shard", default=None, help="i/k: evaluate the i-th of k parts of the new rows")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--range", default=None, help="A:B: evaluate positions A..B-1 (A >= validated rows) instead")
    ap.add_argument("--report", default=None, help="pool what the shards saved and write this JSON")
    args = ap.parse_args()
    run = Run.open(Path(args.run))
    if args.range is not None:
        a, b = (int(x) for x in args.range.split(":"))
        evaluate(run, args.rows, a % 2, 2, args.chunk, span=range(a, b))
    elif args.shard is not None:
        shard, shards = (int(x) for x in args.shard.split("/"))
        evaluate(run, args.rows, shard, shards, args.chunk)
    else:
        report(run, args.rows, Path(args.report) if args.report else None)


if __name__ == "__main__":
    main()
