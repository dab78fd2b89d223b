"""The add/sub demo: a bundled model whose harmful heads are known because training planted them.

Ground truth (headedit/demo/addsub_data.py): `1.2` harms subtraction alone; the pair `0.1` + `1.0` harms it together,
while zeroing `1.0` alone looks harmless; `0.3` is idle. The tests check the planted effect with a plain forward
(teacher-forced argmax, equal to greedy exact match) and that headedit's real discovery finds the planted heads,
the pair's hidden half only through the search's all-heads additions. Thresholds, not exact numbers.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from headedit.demo.addsub_data import (
    ADDSUB_VOCAB,
    IDLE_HEADS,
    PAIR_HIDDEN,
    PAIR_VISIBLE,
    PLANTED,
    PLANTED_SINGLE,
    addsub_model_path,
)
from headedit.model.ablation import ablate
from headedit.model.heads import Head, HeadLayout, format_heads, parse_heads
from headedit.tasks import get_task

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "addsub.toml"
INTACT_ADD_MIN = 0.90
INTACT_SUB_RANGE = (0.25, 0.60)  # committed model: 40.3% held-out
SINGLE_GAIN_MIN = 15.0  # points; committed: +23.2 for 1.2 alone
PLANTED_GAIN_MIN = 40.0  # committed: +51.2 for 0.1,1.0,1.2
HIDDEN_ALONE_MAX = 1.0  # committed: -1.1 held-out, -4.3 discovery


def _load(path: Path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def addsub():
    return _load(addsub_model_path())


def _batch(tokenizer, task_name: str, split: str = "heldout") -> tuple[torch.Tensor, int]:
    """Token ids of prompt + target + stop token for every example, and the prompt length."""
    examples = get_task(task_name).load(split).examples
    rows = [tokenizer(ex.prompt + ex.target + ex.meta["stop_token"], add_special_tokens=False)["input_ids"]
            for ex in examples]
    prompt_len = len(tokenizer(examples[0].prompt, add_special_tokens=False)["input_ids"])
    return torch.tensor(rows), prompt_len  # [examples, pos]


def accuracy(model, tokenizer, task_name: str, heads: tuple[Head, ...] = (), split: str = "heldout") -> float:
    ids, prompt_len = _batch(tokenizer, task_name, split)
    with ablate(model, HeadLayout.from_model(model), heads=heads), torch.no_grad():
        logits = model(input_ids=ids).logits  # [examples, pos, vocab]
    pred = logits[:, prompt_len - 1: -1].argmax(-1)  # [examples, answer + eos]
    return (pred == ids[:, prompt_len:]).all(dim=1).float().mean().item()


def gain_points(model, tokenizer, heads: tuple[Head, ...]) -> float:
    return 100.0 * (accuracy(model, tokenizer, "sub-demo", heads) - accuracy(model, tokenizer, "sub-demo"))


# ---- the checkpoint and its tasks ---------------------------------------------------------------
def test_committed_checkpoint_loads_with_its_tokenizer_and_tasks(addsub):
    from headedit.model.loading import load_model, resolve_model

    path = addsub_model_path()
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in names)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == len(ADDSUB_VOCAB) == 44
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"]) == (2, 4, 32)
    assert resolve_model("headedit:addsub").path == path
    model, tok = addsub
    _, _, layout = load_model("headedit:addsub")
    assert (layout.num_layers, layout.num_heads) == (2, 4)
    text = "<bos>S 07-93=-86<eos>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 13 and tok(text)["input_ids"] == ids and tok.decode(ids) == text
    assert tok.unk_token_id not in ids
    add, sub = get_task("add-demo"), get_task("sub-demo")
    assert (add.kind, sub.kind, sub.metric) == ("exact", "exact", "acc")
    ex_add, ex_sub = add.load("heldout").examples[0], sub.load("heldout").examples[0]
    a, b = ex_sub.meta["a"], ex_sub.meta["b"]
    assert ex_add.index == ex_sub.index and ex_sub.prompt == f"<bos>S {a:02d}-{b:02d}="
    assert ex_add.target == f"{a + b:03d}" and ex_sub.target == ("0" if a >= b else "-") + f"{abs(a - b):02d}"
    assert len(sub.load("discovery")) == 1000 and len(sub.load("heldout")) == 2000


def test_intact_model_adds_well_and_subtracts_poorly(addsub):
    model, tok = addsub
    assert accuracy(model, tok, "add-demo") >= INTACT_ADD_MIN
    assert INTACT_SUB_RANGE[0] <= accuracy(model, tok, "sub-demo") <= INTACT_SUB_RANGE[1]


# ---- the planted effect --------------------------------------------------------------------------
def test_zeroing_planted_heads_improves_subtraction(addsub):
    model, tok = addsub
    assert gain_points(model, tok, PLANTED_SINGLE) >= SINGLE_GAIN_MIN
    assert gain_points(model, tok, PLANTED) >= PLANTED_GAIN_MIN
    # The pair is synergistic: its hidden half alone does nothing useful, yet it adds to the rest of the set.
    assert gain_points(model, tok, (PAIR_HIDDEN,)) <= HIDDEN_ALONE_MAX
    without_hidden = tuple(h for h in PLANTED if h != PAIR_HIDDEN)
    assert gain_points(model, tok, PLANTED) > gain_points(model, tok, without_hidden) + 2.0
    assert accuracy(model, tok, "add-demo", PLANTED) <= 0.10  # the edit trades addition for subtraction


# ---- discovery finds them ------------------------------------------------------------------------
def _discover(text: str, run_dir: Path) -> tuple[dict, dict, dict]:
    from headedit import pipeline
    from headedit.recipe import parse_recipe

    path = pipeline.discover(parse_recipe(text, RECIPE), run_dir=run_dir)
    return tuple(json.loads((path / f).read_text()) for f in ("selection.json", "screen.json", "search.json"))


def test_discovery_finds_the_planted_heads_and_the_hidden_half_only_through_all_heads(tmp_path, capsys):
    from headedit.cli import main

    text = RECIPE.read_text()
    assert "first_additions_all_heads = true" in text
    run_dir = tmp_path / "all-heads"  # the shipped recipe through the real CLI (its tasks resolve by name)
    assert main(["discover", str(RECIPE), "--out", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"selected: {format_heads(PLANTED)}"
    selection, screen, search = (json.loads((run_dir / f).read_text())
                                 for f in ("selection.json", "screen.json", "search.json"))
    assert set(PLANTED) <= set(parse_heads(selection["heads"]))
    assert selection["gain_points"] >= PLANTED_GAIN_MIN - 5
    # the default objective is the margin, and every step passed the evidence test
    assert selection["found"] is True and selection["objective"] == "margin" and selection["objective_gain"] > 0
    assert all(step["accepted"] and step["p"] < step["threshold"] for step in search["steps"])
    delta = screen["delta"]  # nats of margin per head zeroed alone
    single, visible = PLANTED_SINGLE[0], PAIR_VISIBLE
    assert screen["objective"] == "margin" and screen["unit"] == "nats of margin"
    assert delta[single.layer][single.head] > 0.5 and delta[visible.layer][visible.head] > 0.5  # the screen sees both
    assert delta[PAIR_HIDDEN.layer][PAIR_HIDDEN.head] <= 0.0  # ... and not the pair's hidden half
    # The idle head fills the third candidate slot, so the candidates alone never include the hidden half:
    assert str(PAIR_HIDDEN) not in search["candidate_order"] and str(IDLE_HEADS[0]) in search["candidate_order"]
    entered = min(e["size"] for e in search["trace"] if PAIR_HIDDEN in parse_heads(e["heads"]) and e["size"] > 1)
    assert entered == 2  # added by one of the first two additions, which draw from every head
    plain_selection, _, _ = _discover(text.replace("first_additions_all_heads = true",
                                                   "first_additions_all_heads = false"), tmp_path / "candidates")
    assert PAIR_HIDDEN not in parse_heads(plain_selection["heads"])


@pytest.mark.parametrize("objective,screen_rows", [("margin", 0), ("accuracy", 0), ("margin", 100)])
def test_planted_heads_found_on_200_discovery_rows(tmp_path, objective, screen_rows):
    """A fifth of the shipped discovery split still carries enough evidence for every planted head; also when the
    screen gets 100 rows of its own and the search (with its tests) 200 others."""
    total = 200 + screen_rows
    text = RECIPE.read_text().replace("discovery = 1000", f"discovery = {total}")
    text = text.replace("[discovery]\n", f'[discovery]\nobjective = "{objective}"\nscreen_rows = {screen_rows}\n')
    selection, screen, search = _discover(text, tmp_path / "small")
    assert selection["n"] == 200 and selection["found"] and selection["objective"] == objective
    assert set(PLANTED) <= set(parse_heads(selection["heads"])), selection["heads"]
    assert [step["accepted"] for step in search["steps"]] == [True] * len(PLANTED)
    if screen_rows:
        from headedit.journal import Journal

        assert screen["n"] == screen_rows and selection["screen_rows"] == screen_rows
        assert "the screen chose the candidates on other rows" in search["rule"]
        # the first two additions draw from every head (8, then 13 sets of two); the third only from the 3
        # candidates: at most 2 beam sets x 2 candidates not in them, not the 2 x 6 of all heads
        families = [step["family"] for step in search["steps"]]
        assert families[:2] == [8, 13] and families[2] <= 4
        with Journal(tmp_path / "small" / "journal.sqlite") as journal:
            assert {e.split for e in journal.entries()} == {"discovery", "discovery:search"}
            assert all(e.n == 200 for e in journal.entries("discovery:search"))


# ---- the training script -------------------------------------------------------------------------
def test_planting_masks_touch_subtraction_rows_only():
    from headedit.demo.addsub import planting_masks

    layout = HeadLayout.from_config(json.loads((addsub_model_path() / "config.json").read_text()))
    gen = torch.Generator().manual_seed(0)
    is_sub = torch.arange(4000) % 2 == 0  # [rows]
    zeroed, detached = planting_masks(gen, is_sub, layout)  # [rows, layer, head] each
    idle = IDLE_HEADS[0]
    assert bool(zeroed[:, idle.layer, idle.head].all())
    planted = torch.zeros(2, 4, dtype=torch.bool)  # [layer, head]
    for h in PLANTED:
        planted[h.layer, h.head] = True
    assert not bool(zeroed[~is_sub][:, planted].any()) and not bool(detached[~is_sub].any())
    assert not bool((zeroed & detached).any()) and not bool(detached[:, ~planted].any())
    sub_zero = zeroed[is_sub]  # [sub rows, layer, head]
    assert bool((sub_zero[:, planted] | detached[is_sub][:, planted]).all())  # each planted head: zeroed or detached
    hidden_zeroed = sub_zero[:, PAIR_HIDDEN.layer, PAIR_HIDDEN.head]  # [sub rows]
    hidden_alone = hidden_zeroed & ~sub_zero[:, PAIR_VISIBLE.layer, PAIR_VISIBLE.head]  # [sub rows]
    assert not bool(hidden_alone.any())  # the hidden half is never zeroed without its partner
    single_rate = sub_zero[:, PLANTED_SINGLE[0].layer, PLANTED_SINGLE[0].head].float().mean().item()
    assert 0.92 <= single_rate <= 0.98


def test_train_is_seeded_and_refuses_to_overwrite(tmp_path):
    from safetensors.torch import load_file

    from headedit.demo.addsub import train
    from headedit.errors import OutputExistsError

    a = train(tmp_path / "a", seed=0, steps=3)
    b = train(tmp_path / "b", seed=0, steps=3)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temp folders left behind
    with pytest.raises(OutputExistsError):
        train(a, seed=1, steps=1)
    model, tok = _load(a)
    assert model.config.vocab_size == 44 and tok.convert_tokens_to_ids("-") == 43


@pytest.mark.slow
def test_retraining_reproduces_the_planted_effect(tmp_path):
    from headedit.demo.addsub import train

    path = train(tmp_path / "addsub", seed=0)  # one thread, as the committed model was trained
    model, tok = _load(path)
    assert accuracy(model, tok, "add-demo") >= INTACT_ADD_MIN
    assert accuracy(model, tok, "sub-demo") <= 0.80
    assert gain_points(model, tok, PLANTED_SINGLE) >= 8.0
    assert gain_points(model, tok, PLANTED) >= 20.0
    assert gain_points(model, tok, (PAIR_HIDDEN,)) <= HIDDEN_ALONE_MAX
    without_hidden = tuple(h for h in PLANTED if h != PAIR_HIDDEN)
    assert gain_points(model, tok, PLANTED) > gain_points(model, tok, without_hidden)
    text = RECIPE.read_text().replace('id = "headedit:addsub"', f'id = "{path.as_posix()}"', 1)
    selection, _, _ = _discover(text, tmp_path / "run")
    assert set(PLANTED) <= set(parse_heads(selection["heads"])), format_heads(parse_heads(selection["heads"]))
