"""The bundled demo model: loads as a plain checkpoint, its tasks are sound, and CEL is really in it.

Accuracies are teacher-forced argmax checks with a plain forward (every answer token and <eos> must be
the argmax), which equals greedy exact match. Thresholds, not exact numbers: retraining elsewhere may differ.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from headedit.demo.data import VOCAB, index_pair, split_pairs
from headedit.demo.tasks import demo_model_path
from headedit.errors import TaskError
from headedit.model.ablation import ablate
from headedit.model.heads import Head, HeadLayout, parse_heads
from headedit.tasks import get_task, task_names

# The layer-0 heads whose zeroing flips the committed model to copy-second (see headedit/demo/README.md).
FOUND_HEADS = "0.0"
INTACT_FIRST_MIN, INTACT_SECOND_MAX = 0.90, 0.10
EDITED_SECOND_MIN, EDITED_FIRST_MAX = 0.90, 0.10


def _load(path: Path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def demo():
    return _load(demo_model_path())


def _batch(tokenizer, task_name: str, split: str) -> tuple[torch.Tensor, int]:
    """Token ids of prompt + target + stop token for every example, and the prompt length."""
    examples = get_task(task_name).load(split).examples
    rows = [
        tokenizer(ex.prompt + ex.target + ex.meta["stop_token"], add_special_tokens=False)["input_ids"]
        for ex in examples
    ]
    prompt_len = len(tokenizer(examples[0].prompt, add_special_tokens=False)["input_ids"])
    return torch.tensor(rows), prompt_len  # [examples, pos]


def accuracy(model, tokenizer, task_name: str, split: str = "heldout", heads=(), batch=None) -> float:
    ids, prompt_len = batch or _batch(tokenizer, task_name, split)
    with ablate(model, HeadLayout.from_model(model), heads=heads), torch.no_grad():
        logits = model(input_ids=ids).logits  # [examples, pos, vocab]
    pred = logits[:, prompt_len - 1 : -1].argmax(-1)  # [examples, answer + eos]
    return (pred == ids[:, prompt_len:]).all(dim=1).float().mean().item()


# ---- the checkpoint ---------------------------------------------------------------------------
def test_committed_checkpoint_is_safetensors_llama(demo):
    path = demo_model_path()
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in names)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"]) == (2, 4, 32)
    assert cfg["vocab_size"] == len(VOCAB) == 43 and cfg["tie_word_embeddings"] is False
    model, _ = demo
    assert sum(p.numel() for p in model.parameters()) == 35_680
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    layout = HeadLayout.from_model(model)
    assert (layout.num_layers, layout.num_heads, layout.head_dim) == (2, 4, 8)


def test_tokenizer_round_trips_offline(demo):
    _, tok = demo
    assert len(tok) == 43
    text = "<bos>A 07+93=093<eos>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 13 and ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok(text)["input_ids"] == ids  # the tokenizer adds no BOS of its own
    assert tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(ids[1:9]) == list("A 07+93=")


def test_tokenizer_saves_and_reloads(demo, tmp_path):
    _, tok = demo
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "<bos>A 55+12=012<eos>"
    assert again(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]


# ---- the tasks ---------------------------------------------------------------------------------
def test_tasks_registered_as_exact_tasks(demo):
    _, tok = demo
    assert {"copy-first", "copy-second"} <= set(task_names())
    first, second = get_task("copy-first"), get_task("copy-second")
    assert (first.kind, first.metric, second.kind, second.metric) == ("exact", "acc", "exact", "acc")
    ex_first = first.load("heldout").examples[0]
    ex_second = second.load("heldout").examples[0]
    assert ex_first.prompt == ex_second.prompt  # no cue: the tasks share the prompt exactly
    a, b = index_pair(ex_first.index)
    assert ex_first.prompt == f"<bos>A {a:02d}+{b:02d}="
    assert (ex_first.target, ex_second.target) == (f"0{a:02d}", f"0{b:02d}")
    assert ex_first.meta["stop_token"] == tok.eos_token
    prompt_ids = tok(ex_first.prompt, add_special_tokens=False)["input_ids"]
    assert prompt_ids[0] == tok.bos_token_id and len(prompt_ids) == 9


def test_splits_disjoint_complete_and_deterministic():
    train, disc, held = (set(split_pairs(s)) for s in ("train", "discovery", "heldout"))
    assert (len(train), len(disc), len(held)) == (7000, 1000, 2000)
    assert not (train & disc or train & held or disc & held)
    assert train | disc | held == set(range(10_000))
    task = get_task("copy-second")
    d1, d2 = task.load("discovery"), task.load("discovery", seed=5)
    assert [e.index for e in d1.examples] == [e.index for e in d2.examples] == split_pairs("discovery")
    assert len(task.load("heldout")) == 2000
    small = task.load("discovery", size=100, seed=3)
    assert [e.index for e in small.examples] == [e.index for e in task.load("discovery", size=100, seed=3).examples]
    assert [e.index for e in small.examples] != [e.index for e in task.load("discovery", size=100, seed=4).examples]
    assert {e.index for e in small.examples} <= disc
    assert [e.index for e in task.load("discovery", size=50, seed=3).examples] == [e.index for e in small.examples][:50]


def test_bad_split_or_size_is_a_task_error():
    task = get_task("copy-first")
    with pytest.raises(TaskError, match="1000 pairs, 1001 requested"):
        task.load("discovery", size=1001)
    with pytest.raises(TaskError, match="no split"):
        task.load("train")


# ---- the effect ----------------------------------------------------------------------------------
def test_intact_model_answers_copy_first(demo):
    model, tok = demo
    assert accuracy(model, tok, "copy-first") >= INTACT_FIRST_MIN
    assert accuracy(model, tok, "copy-second") <= INTACT_SECOND_MAX


def test_ablating_found_heads_flips_to_copy_second(demo):
    model, tok = demo
    heads = parse_heads(FOUND_HEADS)
    assert all(h.layer == 0 for h in heads)
    assert accuracy(model, tok, "copy-second", heads=heads) >= EDITED_SECOND_MIN
    assert accuracy(model, tok, "copy-first", heads=heads) <= EDITED_FIRST_MAX


def best_flip(model, tok) -> tuple[tuple[Head, ...], float]:
    """The one or two heads whose zeroing gives the best copy-second accuracy on discovery."""
    layout = HeadLayout.from_model(model)
    candidates = [c for k in (1, 2) for c in itertools.combinations(layout.all_heads(), k)]
    batch = _batch(tok, "copy-second", "discovery")
    scored = [(accuracy(model, tok, "copy-second", heads=c, batch=batch), c) for c in candidates]
    acc, heads = max(scored, key=lambda s: (s[0], -len(s[1])))
    return heads, acc


@pytest.mark.slow
def test_retraining_reproduces_the_effect(tmp_path):
    from headedit.demo.train import train

    # One thread: the weights are bit-identical to a 2-thread run (checked when the model was committed),
    # and on a shared CPU two threads spend most of their time contending.
    path = train(tmp_path / "demo", seed=0, threads=1)
    model, tok = _load(path)
    assert accuracy(model, tok, "copy-first") >= INTACT_FIRST_MIN
    assert accuracy(model, tok, "copy-second") <= INTACT_SECOND_MAX
    heads, _ = best_flip(model, tok)  # chosen on discovery, judged on held-out
    assert any(h.layer == 0 for h in heads)
    assert accuracy(model, tok, "copy-second", heads=heads) >= EDITED_SECOND_MIN
    assert accuracy(model, tok, "copy-first", heads=heads) <= EDITED_FIRST_MAX


def test_train_is_seeded_atomic_and_reports(tmp_path):
    """A few steps: same seed (and thread count) gives identical weights, another seed does not; safetensors
    only; no overwrite. Across thread counts the last bits may differ on some CPUs, so that is not asserted."""
    from safetensors.torch import load_file

    from headedit.demo.train import train
    from headedit.errors import OutputExistsError
    from headedit.events import StageFinished, StageProgress, StageStarted

    events = []
    a = train(tmp_path / "a", seed=0, steps=5, reporter=events.append, threads=1)
    b = train(tmp_path / "b", seed=0, steps=5, threads=1)
    c = train(tmp_path / "c", seed=1, steps=5, threads=1)
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no temp folders left behind
    assert not any(p.suffix in (".bin", ".pt") for p in a.iterdir())
    kinds = [type(e) for e in events]
    assert kinds[0] is StageStarted and StageProgress in kinds and StageFinished in kinds
    model, tok = _load(a)
    assert model.config.num_hidden_layers == 2 and tok.bos_token == "<bos>"
    with pytest.raises(OutputExistsError):
        train(a, seed=0, steps=1)
    assert torch.equal(load_file(a / "model.safetensors")["lm_head.weight"], wa["lm_head.weight"])
    assert train(a, seed=1, steps=5, force=True, threads=1) == a
    assert torch.equal(load_file(a / "model.safetensors")["lm_head.weight"], wc["lm_head.weight"])


def test_engine_requires_the_stop_token_like_the_independent_check(demo):
    """The demo's answers end with `<eos>` (meta stop_token): the engine's exact match must require it.
    Checked per example against a plain forward of prompt + target + `<eos>`, under ablations where the
    stop token decides (ablating 0.1 leaves right digits without `<eos>` on some pairs)."""
    from headedit.engine.core import Engine

    model, tok = demo
    layout = HeadLayout.from_model(model)
    task = get_task("copy-second")
    examples = list(task.load("discovery").examples)[:400]
    ids = torch.tensor([tok(ex.prompt + ex.target + ex.meta["stop_token"], add_special_tokens=False)["input_ids"]
                        for ex in examples])  # [examples, pos]
    prompt_len = len(tok(examples[0].prompt, add_special_tokens=False)["input_ids"])
    sets = [(), (Head(0, 1),), (Head(0, 0),)]
    got = Engine(model, tok, layout, batch_size=64).correctness(task, examples, sets)
    stop_decided = 0
    for s, heads in enumerate(sets):
        with ablate(model, layout, heads=heads), torch.no_grad():
            pred = model(input_ids=ids).logits[:, prompt_len - 1: -1].argmax(-1)  # [examples, answer + eos]
        hit = pred == ids[:, prompt_len:]  # [examples, answer + eos]
        expect = hit.all(dim=1)
        assert got[s].tolist() == expect.tolist(), heads
        stop_decided += int((hit[:, :-1].all(dim=1) & ~hit[:, -1]).sum())
    assert stop_decided > 0  # some rows are right on the digits and wrong only on the stop token
