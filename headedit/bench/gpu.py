"""`headedit bench gpu`: the single-head screen at a real model's shapes on CUDA, fast engine vs naive loop.

A random-weight model built from a real config.json (SmolLM3-3B by default: full depth, real hidden size,
heads, KV heads and vocabulary; no weights are downloaded) in bfloat16 with SDPA attention is loaded straight
onto the GPU. Workload: the arithmetic task (the smollm3-arithmetic recipe's chat format), every head ablated
alone plus intact, on `--n` examples, through the fast engine (set packing, prefix reuse, batch size found by
`headedit.engine.autobatch`). The naive path (one unbatched `generate` per example per set: `bench_eval`) runs on a
few of the same sets and examples; per (set, example) the two times give the fast/naive ratio, and the bits
of those sets must be identical. Executed FLOPs are counted by hooks on every decoder layer and the LM head
(real rows x positions, padding included), so TFLOP/s is what the GPU did, not a model.
Random weights make the accuracies meaningless: this measures speed only. The tokenizer is the offline
byte-level `tiny_tokenizer` (longer sequences than the real one, ids valid for the real vocabulary).
`--tiny` runs the same code on a 2-layer toy on CPU in seconds (the test suite's smoke test).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headedit.bench.flops import FlopCounter
from headedit.errors import HeadeditError
from headedit.model.heads import Head, HeadLayout

DEFAULT_CONFIG = "SmolLM3-3B/config.json"  # under $HEADEDIT_DATA_DIR/../tokenizers


def build_model(config_file: Path | None, device: str, dtype: torch.dtype, tiny: bool) -> tuple[Any, str]:
    """Random weights at the config's shapes, initialised directly on `device` (no host copy of 3B weights)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # lazy: loaded when a benchmark runs
    from headedit.bench.tiny import tiny_config, tiny_tokenizer

    vocab = len(tiny_tokenizer())
    if tiny:
        config = tiny_config("smollm3", vocab_size=vocab, num_hidden_layers=2, hidden_size=64,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
        label = "tiny smollm3-style toy (2 layers x 4 heads, hidden 64)"
    else:
        if config_file is None or not config_file.is_file():
            raise HeadeditError(f"no model config at {config_file}",
                                "pass --config PATH/config.json or set HEADEDIT_DATA_DIR (its ../tokenizers is used)")
        real = json.loads(config_file.read_text())
        params = {k: v for k, v in real.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
        params.update(bos_token_id=0, eos_token_id=1, pad_token_id=2, use_cache=True)  # tiny tokenizer's ids
        config = CONFIG_MAPPING[real["model_type"]](**params)
        label = f"random {real['model_type']} at {config_file.parent.name} shapes ({real['num_hidden_layers']} layers)"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    model.generation_config.pad_token_id = 2
    model.generation_config.eos_token_id = 1
    return model, label


def run_bench(model: Any, n: int = 128, naive_sets: int = 3, naive_n: int = 16, batch_size: int | str = "auto",
              reporter: Any = None) -> dict[str, Any]:
    # lazy: loaded when a benchmark runs
    from headedit.bench.tiny import tiny_tokenizer
    from headedit.engine.autobatch import resolve_batch
    from headedit.engine.core import Engine
    from headedit.engine.reference import reference_correctness
    from headedit.events import null_reporter
    from headedit.tasks import get_task

    tokenizer = tiny_tokenizer()
    layout = HeadLayout.from_model(model)
    task = get_task("arithmetic")
    examples = list(task.load("discovery", n, 0, None).examples)
    chat = {"enable_thinking": False}
    sets: list[tuple[Head, ...]] = [()] + [(h,) for h in layout.all_heads()]
    engine = Engine(model, tokenizer, layout, batch_size=16, max_rows=16 * 8, chat_template_kwargs=chat, chat=True)
    cuda = engine.device.type == "cuda"
    batch = resolve_batch(engine, batch_size, task, examples, None, reporter or null_reporter)
    tokens = [len(engine.plan(task, ex)[0].tokens) for ex in examples]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(engine.device)

    counter = FlopCounter(model, layout)
    try:
        engine.clear_caches()
        sync()
        start = time.perf_counter()
        fast = engine.correctness(task, examples, sets)  # [sets, examples]
        sync()
        t_fast = time.perf_counter() - start
        fast_flops = counter.flops
        chosen = [0] + [1 + (i * (len(sets) - 2)) // max(1, naive_sets - 1) for i in range(max(0, naive_sets - 1))]
        chosen = sorted(set(min(c, len(sets) - 1) for c in chosen))
        sub = examples[:naive_n]
        sync()
        start = time.perf_counter()
        naive = np.stack([reference_correctness(model, tokenizer, layout, task, sub, sets[c], True, chat)
                          for c in chosen])
        sync()
        t_naive = time.perf_counter() - start
    finally:
        counter.close()
    fast_per = t_fast / (len(sets) * len(examples))
    naive_per = t_naive / (len(chosen) * len(sub))
    return {
        "heads": layout.total_heads, "layers": layout.num_layers, "n": len(examples), "sets": len(sets),
        "tokens_mean": float(np.mean(tokens)), "tokens_max": int(max(tokens)), "batch": batch,
        "fast_s": t_fast, "set_examples_per_s": len(sets) * len(examples) / t_fast,
        "examples_per_s": len(examples) / t_fast * 1.0, "fast_tflops": fast_flops / t_fast / 1e12,
        "fast_flops": fast_flops, "naive_s": t_naive, "naive_set_examples": len(chosen) * len(sub),
        "ratio": naive_per / fast_per, "identical": bool(np.array_equal(naive, fast[chosen][:, : len(sub)])),
        "forwards": engine.forwards, "device": str(engine.device), "dtype": str(engine.dtype).replace("torch.", ""),
        "gpu": torch.cuda.get_device_name(engine.device) if cuda else "cpu",
        "peak_mem_gib": torch.cuda.max_memory_allocated(engine.device) / 2**30 if cuda else 0.0,
    }
