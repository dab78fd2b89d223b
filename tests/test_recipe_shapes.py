"""Every paper recipe at its model's REAL head shapes (heads, KV heads, head_dim, hidden size from the real
config.json) but reduced depth (2 layers), random weights: one small batch of the recipe's real task through
the engine with several ablation sets at once equals the sets one at a time.

What is reduced, to keep CPU time and memory small: depth (2 layers), vocab (the tiny byte-level tokenizer's,
since the real vocabularies cannot be downloaded offline: `headedit.bench.tiny.tiny_tokenizer`, whose chat template
honours `enable_thinking`), intermediate_size (the MLP does not touch heads), and mbpp's generation length
(1 example, 8 new tokens instead of 256). boolq, hellaswag and mbpp use the real data under HEADEDIT_DATA_DIR.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from headedit.bench.tiny import tiny_tokenizer
from headedit.engine.core import Engine
from headedit.model.heads import Head, HeadLayout
from headedit.recipe import load_recipe
from headedit.tasks import get_task

torch.set_num_threads(1)
# Paper-shape recipes only: the bundled models' recipes (demo, addsub and their remove variants) and the real GGUF's
# (smollm2-135m-*, whose shapes tests/test_real_model.py covers on the real file) are not of that kind.
RECIPES = sorted(p for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.toml")
                 if not p.stem.startswith(("demo", "addsub", "smollm2-135m-")))
CONFIGS = {  # recipe model id -> real config file under shared/data/tokenizers
    "HuggingFaceTB/SmolLM3-3B": "SmolLM3-3B/config.json",
    "meta-llama/Llama-3.2-3B": "Llama-3.2-3B/config.json",
    "Qwen/Qwen2.5-3B-Instruct": "Qwen2.5-3B-Instruct/config.Qwen2.5-3B-base.json",
}
LAYERS = 2
EXAMPLES = 2


def _tokenizers_dir() -> Path:
    if "HEADEDIT_DATA_DIR" not in os.environ:
        pytest.skip("HEADEDIT_DATA_DIR not set")
    return Path(os.environ["HEADEDIT_DATA_DIR"]).parent / "tokenizers"


def reduced_model(config_file: Path, tokenizer) -> tuple[torch.nn.Module, dict]:
    """Random weights, real attention shapes, 2 layers; returns the model and the real config dict."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    real = json.loads(config_file.read_text())
    params = {k: v for k, v in real.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    params.update(num_hidden_layers=LAYERS, vocab_size=len(tokenizer), intermediate_size=64,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, max_window_layers=LAYERS, use_cache=True)
    if "layer_types" in params:
        params["layer_types"] = params["layer_types"][:LAYERS]
    if "no_rope_layers" in params:  # SmolLM3: keep one rotary and one no-rope layer, as the real model mixes both
        params["no_rope_layers"] = [1, 0]
    config = CONFIG_MAPPING[real["model_type"]](**params)
    config.initializer_range = 0.2  # peaked logits, so answers vary between sets
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return model, real


def _examples(task, recipe, count: int) -> list:
    split = task.load("discovery", size=min(recipe.task.discovery, 40), seed=recipe.task.seed, data_dir=None)
    shortest = sorted(split.examples, key=lambda e: (len(e.prompt) + sum(len(c) for c in e.choices), e.index))
    return shortest[:count]


@pytest.mark.parametrize("recipe_file", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_batch_at_real_head_shapes(recipe_file: Path) -> None:
    folder = _tokenizers_dir()
    recipe = load_recipe(recipe_file)
    assert recipe.model.id in CONFIGS, f"no real config mapped for {recipe.model.id}"
    tokenizer = tiny_tokenizer()
    model, real = reduced_model(folder / CONFIGS[recipe.model.id], tokenizer)

    layout = HeadLayout.from_model(model)
    head_dim = real.get("head_dim") or real["hidden_size"] // real["num_attention_heads"]
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads, layout.head_dim) == (
        LAYERS, real["num_attention_heads"], real["num_key_value_heads"], head_dim)
    o_proj = model.get_submodule(layout.o_proj_path(1)).weight
    assert tuple(o_proj.shape) == (real["hidden_size"], real["num_attention_heads"] * head_dim)  # [hidden, head*d]

    task = get_task(recipe.task.name)
    if task.kind == "generate":
        task = copy.copy(task)
        task.max_new_tokens = 8
    count = 1 if task.kind == "generate" else EXAMPLES
    examples = _examples(task, recipe, count)
    assert len(examples) == count
    H = layout.num_heads
    sets = [(), (Head(0, 1),), (Head(1, H - 1),), (Head(0, 2), Head(1, 0), Head(1, H // 2))]
    if task.kind == "generate":  # each set re-drafts from where it leaves the intact answer: keep it to two
        sets = sets[:3]
    kwargs = dict(chat_template_kwargs=dict(recipe.model.chat_template_kwargs) or None, chat=recipe.task.chat)

    packed = Engine(model, tokenizer, layout, batch_size=count, max_rows=count * len(sets), **kwargs)
    together = packed.correctness(task, examples, sets)
    assert together.shape == (len(sets), count) and together.dtype == bool
    for s, heads in enumerate(sets):  # a fresh engine, no packing, no prefix reuse, one set
        alone = Engine(model, tokenizer, layout, batch_size=1, prefix_reuse=False, **kwargs)
        assert np.array_equal(alone.correctness(task, examples, [heads])[0], together[s]), heads

    if task.kind != "generate":  # the scores behind the bits agree too, and every ablation moves them
        plans = packed.plans(task, examples)
        raw = packed.score_plans(plans, sets)
        single = Engine(model, tokenizer, layout, batch_size=count, prefix_reuse=False, **kwargs)
        intact = np.concatenate([sc.logprob for _, sc in raw[0]])
        for s, heads in enumerate(sets):
            (ref,) = single.score_plans(plans, [heads])
            got = np.concatenate([sc.logprob for _, sc in raw[s]])
            assert np.allclose(got, np.concatenate([sc.logprob for _, sc in ref]), atol=1e-4), heads
            if heads:
                assert not np.allclose(got, intact, atol=1e-6), f"ablating {heads} changed nothing"
