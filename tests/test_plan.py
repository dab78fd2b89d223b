"""Cost plan: parameter counts of real configs, evaluation counts per stage, real token counts, and a CPU time
estimate checked against a timed forward loop of a small random Llama doing the same work.

The time check is a ratio (estimate / measured within 2x), calibrated at plan time by `--device-flops cpu`
measuring this machine's matmul throughput, so it holds on slow and fast machines alike.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from testkit.recipes import recipe_toml

from headedit.cli import main as cli_main
from headedit.model.heads import Head
from headedit.plan import (
    TokenStats,
    device_flops,
    load_tokenizer,
    make_plan,
    model_cost,
    read_model_config,
    search_evaluations,
)
from headedit.recipe import parse_recipe
from headedit.tasks import Example, Split, Task, register_task

DIGITS = "0123456789"


class _DigitsTask(Task):
    """A real registered exact-match task with prompts of a fixed token length (digits are single bytes)."""

    name = "plan-test-digits"
    kind = "exact"
    default_sizes = (8, 12)

    def load(self, split, size=None, seed=0, data_dir=None):
        n = size or self.default_sizes[0 if split == "discovery" else 1]
        offset = 0 if split == "discovery" else 1000
        examples = [Example(offset + i, "".join(DIGITS[(i * 7 + j) % 10] for j in range(40)), target="5")
                    for i in range(n)]
        return Split(self.name, split, examples, source="generated digits")


register_task(_DigitsTask())


def recipe(discovery: str = "", side: str = "", model: str = "x/y", task: str = "plan-test-digits"):
    text = recipe_toml("p", model={"id": model, "dtype": "float32"}, task={"name": task, "discovery": 8, "heldout": 12})
    return parse_recipe(f"{text}[discovery]\n{discovery}\n[validation]\n{side}\n")


def tokenizers_dir() -> Path:
    if "HEADEDIT_DATA_DIR" not in os.environ:
        pytest.skip("HEADEDIT_DATA_DIR not set")
    path = Path(os.environ["HEADEDIT_DATA_DIR"]).parent / "tokenizers"
    if not path.is_dir():
        pytest.skip(f"{path} absent")
    return path


# ---- real configs ---------------------------------------------------------------------------------
@pytest.mark.realdata
@pytest.mark.parametrize("file,layers,heads,kv,params", [
    ("SmolLM3-3B/config.json", 36, 16, 4, 3.08e9),  # model card: 3.08B
    ("Llama-3.2-3B/config.json", 28, 24, 8, 3.21e9),  # model card: 3.21B
    ("Qwen2.5-3B-Instruct/config.Qwen2.5-3B-base.json", 36, 16, 2, 3.09e9),  # model card: 3.09B
])
def test_real_config_layout_and_parameters(file, layers, heads, kv, params) -> None:
    config, _, _ = read_model_config("unused", model_path=tokenizers_dir() / file)
    cost = model_cost(config)
    assert (cost.layout.num_layers, cost.layout.num_heads, cost.layout.num_kv_heads) == (layers, heads, kv)
    assert abs(cost.params - params) / params < 0.01, cost.params
    assert cost.dtype == "bfloat16"


def test_parameter_count_matches_a_built_model() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    for cls, cfg in ((LlamaForCausalLM, LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=96, vocab_size=300)),
                     (Qwen2ForCausalLM, Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, intermediate_size=96, vocab_size=300,
                                                    tie_word_embeddings=False))):
        model = cls(cfg)
        assert model_cost(cfg.to_dict()).params == sum(p.numel() for p in model.parameters())


# ---- evaluation counts ----------------------------------------------------------------------------
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 128,
        "vocab_size": 300, "torch_dtype": "float32"}
FIXED = {"plan-test-digits": TokenStats("plan-test-digits", 50.0, 2500.0, 50, 8, "assumed")}


def test_stage_counts() -> None:
    devices = {"x": 1e9}
    single = make_plan(recipe(), TINY, devices=devices, token_overrides=FIXED)
    assert [s.name for s in single.stages] == ["screen:single", "search:greedy", "validate"]
    assert single.stages[0].evaluations == 3 * 4 + 1
    # greedy, 12 heads, default candidates 16 -> pool 12, max 6, beam 2; singles already journaled
    assert single.stages[1].evaluations == sum(2 * (12 - (s - 1)) for s in range(2, 7))
    assert single.stages[2].evaluations == 2
    comp = make_plan(recipe('screen = "compressed"\ncompressed_sets = 40'), TINY, devices=devices, token_overrides=FIXED)
    assert comp.stages[0].evaluations == 41
    assert comp.stages[1].evaluations == 12 + sum(2 * (12 - (s - 1)) for s in range(2, 7))
    auto = make_plan(recipe('screen = "compressed"'), TINY, devices=devices, token_overrides=FIXED)
    assert auto.stages[0].evaluations == 32 + 1
    grad = make_plan(recipe('screen = "gradient"'), TINY, devices=devices, token_overrides=FIXED)
    assert grad.stages[0].evaluations == 2 and grad.stages[0].flops == 4 * single.stages[0].flops / 13
    assert "backward_activations" in grad.memory
    # flops = evaluations x examples x (2 P s + attention), time = flops / FLOP/s
    cost = model_cost(TINY)
    assert single.stages[0].flops == pytest.approx(13 * cost.forward_flops([50] * 8))
    assert single.seconds("x") == pytest.approx(single.flops / 1e9)
    assert single.memory["weights"] == cost.params * 4
    assert single.memory["prefix_cache"] == 8 * 50 * 64 * 3 * 4


def test_search_upper_bounds() -> None:
    r = recipe('search = "exhaustive"\ncandidates = 5\nmax_heads = 3\nexhaustive_size = 2\nbeam = 2')
    # pairs of 5 (singles journaled by the screen), then size 3 from the 2 best pairs: 2 x 3
    assert search_evaluations(r, 12) == math.comb(5, 2) + 2 * 3
    r = recipe("candidates = 4\nmax_heads = 3\nbeam = 3\nfirst_additions_all_heads = true")
    # sizes 1 and 2 draw from all 12 heads (size 1 journaled by the single screen); size 3 from the 4 candidates,
    # which the size-2 beams (drawn from all heads) may not overlap
    assert search_evaluations(r, 12) == 3 * 11 + 3 * 4
    r = recipe('screen = "gradient"\ncandidates = 4\nmax_heads = 2\nbeam = 1')
    assert search_evaluations(r, 12) == 4 + 3


def test_search_bound_covers_the_real_search() -> None:
    """Run headedit.discovery.search on a scorer whose every step improves: the plan's bound must cover it."""
    from headedit.discovery.search import SearchSpec, joint_search

    class Always:  # accuracy grows with set size, so the search never stops early
        n = 1000
        objective = "accuracy"  # the search ranks and tests by the accuracy objective
        continuous = False

        def accuracy(self, s, upto=None):
            return min(1.0, 0.1 * len(s) + 0.001 * sum(h.head + 4 * h.layer for h in s))

        def bits(self, s, upto=None):  # correctness consistent with accuracy(): the first acc*n examples right
            return (np.arange(self.n) < round(self.accuracy(s) * self.n))[: self.n if upto is None else upto]

        def values(self, s, upto=None):
            return self.bits(tuple(s))[: self.n if upto is None else upto].astype(np.float64)

        def mean(self, s, upto=None):
            return float(self.values(s, upto).mean())

        def ensure(self, sets, upto=None, stage=""):
            upto = self.n if upto is None else upto
            return [self.bits(tuple(s))[:upto] for s in sets]

    heads = [Head(layer, head) for layer in range(3) for head in range(4)]
    for text in ("candidates = 6\nmax_heads = 4\nbeam = 2", "candidates = 5\nmax_heads = 3\nbeam = 3\n"
                 "first_additions_all_heads = true", 'candidates = 5\nmax_heads = 4\nsearch = "exhaustive"'):
        r = recipe('screen = "compressed"\n' + text)
        spec = SearchSpec.from_recipe(r.discovery)
        res = joint_search(Always(), heads[: r.discovery.candidates], heads, spec)
        assert len(res.selected) == r.discovery.max_heads
        assert res.evaluations <= search_evaluations(r, 12), text


# ---- tokens ---------------------------------------------------------------------------------------
def test_real_tokenizer_counts_match_the_engine(tmp_path: Path) -> None:
    from headedit.bench.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    config, folder, _ = read_model_config("unused", model_path=tmp_path)
    loaded = load_tokenizer(folder)
    assert loaded is not None
    plan = make_plan(recipe(), config, tokenizer=loaded, devices={"x": 1e9})
    stats = plan.tokens[0]
    # BOS + 40 digits as context, then the target "5": one byte-level token each
    expect = len(tok("0" * 40 + "5")["input_ids"])
    assert stats.source == "tokenizer" and stats.mean == stats.max == expect
    no_tok = make_plan(recipe(), config, tokenizer=None, devices={"x": 1e9})
    assert no_tok.tokens[0].source == "chars/4" and no_tok.tokens[0].mean == math.ceil(41 / 4)
    assert "characters / 4" in no_tok.tokens[0].note


# ---- time estimate against a measured CPU run -----------------------------------------------------
@pytest.mark.slow
def test_cpu_estimate_within_2x_of_a_timed_forward_loop(tmp_path: Path) -> None:
    """The plan's screen time on `cpu` vs a plain timed loop doing the same forwards (one per ablation set)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from headedit.bench.tiny import tiny_tokenizer
    from headedit.engine.batch import plan_example
    from headedit.model.ablation import ablate
    from headedit.model.heads import HeadLayout

    tok = tiny_tokenizer()
    cfg = LlamaConfig(hidden_size=256, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=1024, vocab_size=len(tok))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    r = parse_recipe(recipe_toml("p", model={"id": "x/y", "dtype": "float32"},
                                 task={"name": "plan-test-digits", "discovery": 16},
                                 discovery={"candidates": 2, "max_heads": 1}))
    name, flops_per_s = device_flops("cpu", "float32", cfg.to_dict())
    plan = make_plan(r, cfg.to_dict(), tokenizer=tok, devices={name: flops_per_s})
    screen = plan.stages[0]
    predicted = screen.flops / flops_per_s

    task = _DigitsTask()
    examples = task.load("discovery", r.task.discovery).examples
    rows = [plan_example(task, ex, tok, False, {}, None)[0].tokens for ex in examples]
    ids = torch.tensor(rows)  # [batch, pos]: equal lengths, no padding
    assert screen.tokens == ids.numel() * screen.evaluations
    layout = HeadLayout.from_model(model)
    sets = [()] + [(h,) for h in layout.all_heads()]
    assert len(sets) == screen.evaluations
    ratios = []
    with torch.inference_mode(), ablate(model, layout) as ab:
        model(input_ids=ids)  # warm-up
        for _ in range(3):  # the machine's load moves: calibrate next to each timing, keep the median ratio
            if ratios:
                predicted = screen.flops / device_flops("cpu", "float32", cfg.to_dict())[1]
            start = time.perf_counter()
            for heads in sets:
                ab.set_heads(heads)
                model(input_ids=ids)
            measured = time.perf_counter() - start
            ratios.append(predicted / measured)
    ratio = sorted(ratios)[1]
    print(f"plan/measured ratios {[round(x, 2) for x in ratios]}, median {ratio:.2f}")
    assert 0.5 <= ratio <= 2.0, ratios


# ---- CLI ----------------------------------------------------------------------------------------------
@pytest.mark.realdata
def test_cli_plan_json_on_a_shipped_recipe(capsys) -> None:
    model = tokenizers_dir() / "SmolLM3-3B"
    recipes = Path(__file__).resolve().parent.parent / "recipes"
    rc = cli_main(["plan", str(recipes / "smollm3-arithmetic.toml"), "--model", str(model),
                   "--device-flops", "h100", "--device-flops", "1e12", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"] == pytest.approx(3.08e9, rel=0.01)
    assert out["stages"][0]["evaluations"] == 36 * 16 + 1
    assert set(out["seconds"]) == {"h100", "1e+12 FLOP/s"}
    assert out["seconds"]["1e+12 FLOP/s"] == pytest.approx(out["flops"] / 1e12)
    assert out["seconds"]["h100"] == pytest.approx(out["flops"] / (989e12 * 0.35))
    rc = cli_main(["plan", str(recipes / "smollm3-arithmetic.toml"), "--model", str(model),
                   "--device-flops", "h100"])
    text = capsys.readouterr().out
    assert rc == 0 and "screen:single" in text and "577" in text and "weights" in text


def test_cli_plan_errors_are_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    good = tmp_path / "r.toml"
    good.write_text('name = "p"\n[model]\nid = "x/y"\n[task]\nname = "plan-test-digits"\n')
    assert cli_main(["plan", str(good), "--model", str(tmp_path), "--device-flops", "warp9"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "warp9" in err and "a100" in err
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "p"\n[model]\nid = "x/y"\n[task]\nname = "plan-test-digits"\ncolour = 1\n')
    assert cli_main(["plan", str(bad), "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "task.colour" in err
    assert cli_main(["plan", str(good), "--model", str(tmp_path), "--device-flops", "5e9"]) == 0
