"""The recommended CPU recipe's first step in miniature (docs/discovery.md): the gradient screen's top heads over
all layers, chosen on the rows of scripts/measure_discovery.py, each zeroed alone and judged on rows the screen
never saw.

    OMP_NUM_THREADS=1 nice -n 10 python scripts/measure_pilot.py docs/measurements/smollm2-hellaswag --fresh 96

Writes pilot.npz (intact + each head; bits, margin, log-probability per fresh row) and pilot.json (heads, their
predicted gain, per-objective effects and one-sided p-values, timing).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from measure_discovery import OBJECTIVES, load_smollm2, score_all

from headedit.discovery.evidence import p_value
from headedit.engine.core import Engine
from headedit.model.heads import Head
from headedit.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--fresh", type=int, default=96)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--objective", default="margin", help="which gradient attribution picks the heads")
    args = ap.parse_args()
    torch.set_num_threads(1)
    folder = Path(args.folder)
    meta = json.loads((folder / "meta.json").read_text())
    delta = np.array(json.loads((folder / "gradient.json").read_text())[args.objective]["delta"])  # [layer, head]
    order = np.argsort(-delta, axis=None)[: args.top]
    heads = [Head(int(i) // delta.shape[1], int(i) % delta.shape[1]) for i in order]
    wall, cpu = time.perf_counter(), time.process_time()
    model, tokenizer, layout = load_smollm2()
    task = get_task(meta["task"])
    seen = set(meta["rows"])
    pool = task.load("discovery", size=meta["n"] + args.fresh, seed=0, data_dir="/work/shared/data/hf").examples
    fresh = [ex for ex in pool if ex.index not in seen][: args.fresh]
    engine = Engine(model, tokenizer, layout, batch_size=16)
    start = time.process_time()
    out = score_all(engine, task, fresh, [()] + [(h,) for h in heads])
    np.savez(folder / "pilot.npz", **out)
    result = {"heads": [str(h) for h in heads], "predicted": [float(delta[h.layer][h.head]) for h in heads],
              "fresh_rows": [ex.index for ex in fresh], "n": len(fresh), "picked_by": f"gradient ({args.objective})",
              "cpu_eval": time.process_time() - start, "cpu_total": time.process_time() - cpu,
              "wall_total": time.perf_counter() - wall}
    for obj in OBJECTIVES:
        v = out[obj]
        result[obj] = {"effect": [float((100 if obj == "accuracy" else 1) * (v[1 + i] - v[0]).mean())
                                  for i in range(len(heads))],
                       "p": [p_value(obj, v[0], v[1 + i]) for i in range(len(heads))], "intact": float(v[0].mean())}
    (folder / "pilot.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("heads", "cpu_eval")}), flush=True)


if __name__ == "__main__":
    main()
