"""The continuous discovery objective: computed from the engine's forwards, equal to an independent plain
computation, journaled compatibly (format-1 journals still open and are upgraded), validated in recipes, and
attributed exactly by the gradient screen."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import testkit.coin  # noqa: F401  (registers coin-test)
import torch
from testkit.recipes import recipe_toml

from headedit.bench.eval import synthetic_hellaswag  # noqa: E402
from headedit.bench.tiny import tiny_model, tiny_tokenizer  # noqa: E402
from headedit.discovery.objective import effective, summary  # noqa: E402
from headedit.discovery.scorer import Scorer  # noqa: E402
from headedit.engine.batch import plan_example, stop_token_id  # noqa: E402
from headedit.engine.core import Engine  # noqa: E402
from headedit.errors import RecipeError  # noqa: E402
from headedit.journal import JOURNAL_FORMAT, Journal  # noqa: E402
from headedit.model.ablation import ablate  # noqa: E402
from headedit.model.heads import Head, HeadLayout  # noqa: E402
from headedit.recipe import parse_recipe  # noqa: E402
from headedit.tasks import get_task  # noqa: E402

torch.set_num_threads(1)
SETS = [(), (Head(0, 1),), (Head(1, 2), Head(0, 3))]


@torch.no_grad()
def plain_values(model, tokenizer, task, examples, heads) -> dict[str, np.ndarray]:
    """Margin and log-probability by unbatched forwards, one per choice / answer (no engine code)."""
    layout = HeadLayout.from_model(model)
    stop = stop_token_id(model, tokenizer)
    out = {"margin": np.zeros(len(examples)), "logprob": np.zeros(len(examples))}
    with ablate(model, layout, heads=heads):
        for i, ex in enumerate(examples):
            plan, conts = plan_example(task, ex, tokenizer, False, None, stop)
            ctx = list(plan.tokens[: plan.context_len])
            per = []
            for cont in conts:
                ids = torch.tensor([ctx + list(cont)])  # [1, pos]
                logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # [pos, vocab]
                at = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(cont))
                per.append((logp[at], torch.tensor(cont)))
            if task.kind == "exact":
                rows, target = per[0]
                lp = rows.gather(1, target[:, None])[:, 0]  # [answer tokens]
                rival = rows.scatter(1, target[:, None], float("-inf")).amax(dim=1)  # [answer tokens]
                out["margin"][i], out["logprob"][i] = float((lp - rival).min()), float(lp.sum())
                continue
            scores = np.array([float(rows.gather(1, t[:, None]).sum()) for rows, t in per])
            if task.length_normalize:
                scores = scores / np.array([max(1, n) for n in ex.meta["choice_lengths"]])
            wrong = np.delete(scores, ex.label)
            out["margin"][i] = scores[ex.label] - wrong.max()
            out["logprob"][i] = scores[ex.label] - np.log(np.exp(scores).sum())
    return out


@pytest.mark.parametrize("kind", ["coin", "hellaswag", "addsub"])
def test_engine_objective_equals_plain_forwards(kind):
    if kind == "addsub":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from headedit.demo.addsub_data import addsub_model_path

        model = AutoModelForCausalLM.from_pretrained(addsub_model_path(), dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(addsub_model_path())
        task = get_task("sub-demo")
        examples = list(task.load("discovery").examples[:24])
    else:
        model, tokenizer = tiny_model(seed=3, num_hidden_layers=2), tiny_tokenizer()
        task = get_task("coin-test" if kind == "coin" else "hellaswag")
        examples = list(task.load("discovery", 24).examples) if kind == "coin" else synthetic_hellaswag(12)
    engine = Engine(model, tokenizer, batch_size=8)
    bits = engine.correctness(task, examples, SETS)
    for objective in ("accuracy", "margin", "logprob"):
        got_bits, values = engine.evaluate(task, examples, SETS, objective)
        assert values.dtype == np.float32 and values.shape == bits.shape
        assert np.array_equal(got_bits, bits)
        if objective == "accuracy":
            assert np.array_equal(values, bits.astype(np.float32))
            continue
        for s, heads in enumerate(SETS):
            plain = plain_values(model, tokenizer, task, examples, heads)[objective]
            assert np.allclose(values[s], plain, atol=2e-4, rtol=1e-4), (objective, heads)
    _, margin = engine.evaluate(task, examples, SETS, "margin")
    decided = np.abs(margin) > 1e-5  # the margin is positive exactly when the example is right (ties aside)
    assert np.array_equal((margin > 0)[decided], bits[decided]) and decided.mean() > 0.9
    if task.kind == "choice":
        _, logprob = engine.evaluate(task, examples, SETS, "logprob")
        assert (logprob <= 1e-6).all() and (logprob > -np.log(len(examples[0].choices)) - 50).all()
    # several calls on sub-ranges give the rows of one call (the discovery scorer asks for prefixes)
    _, whole = engine.evaluate(task, examples, SETS[1:], "margin")
    parts = np.concatenate([engine.evaluate(task, examples[a:b], SETS[1:], "margin")[1]
                            for a, b in ((0, 5), (5, 16), (16, len(examples)))], axis=1)
    assert np.allclose(parts, whole, atol=1e-5)


def test_generated_tasks_fall_back_to_accuracy():
    assert effective("margin", "generate") == "accuracy" and effective("logprob", "choice") == "logprob"
    with pytest.raises(ValueError):
        effective("loss", "choice")


def _write_format1_journal(path: Path, bits: np.ndarray) -> None:
    """A journal exactly as format 1 wrote it (no objective column)."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE evaluations (split TEXT NOT NULL, heads TEXT NOT NULL, n INTEGER NOT NULL,
            correct_bits BLOB NOT NULL, stage TEXT NOT NULL, created TEXT NOT NULL, PRIMARY KEY (split, heads));
        CREATE TABLE sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, pid INTEGER NOT NULL, started TEXT NOT NULL,
            sets_evaluated INTEGER NOT NULL DEFAULT 0, examples_evaluated INTEGER NOT NULL DEFAULT 0);
        INSERT INTO meta VALUES ('format', '1');
    """)
    db.execute("INSERT INTO evaluations VALUES ('discovery', '', ?, ?, 'screen:single', '2026-01-01T00:00:00+00:00')",
               (bits.size, np.packbits(bits).tobytes()))
    db.commit()
    db.close()


def test_journal_values_round_trip_and_format1_upgrade(tmp_path):
    rng = np.random.default_rng(0)
    bits = rng.random(40) < 0.5
    values = rng.normal(size=40).astype(np.float32)
    with Journal(tmp_path / "new.sqlite") as j:
        j.put("discovery", "0.1", bits[:16], "s", 16, values=values[:16])
        j.put("discovery", "0.1", bits, "s", 24, values=values)
        j.put("discovery", "", bits, "s", 40)  # bits only (accuracy runs)
    with Journal(tmp_path / "new.sqlite") as j:
        e = j.get("discovery", "0.1")
        assert e.n == 40 and np.array_equal(e.bits, bits) and np.array_equal(e.values, values)
        assert e.values.dtype == np.float32 and j.get("discovery", "").values is None
        with pytest.raises(ValueError):
            j.put("discovery", "0.2", bits, "s", 40, values=values[:3])

    old = tmp_path / "old.sqlite"
    _write_format1_journal(old, bits)
    with Journal(old) as j:  # opens, upgrades in place, keeps the bits
        assert j.get("discovery", "").n == 40 and j.get("discovery", "").values is None
        # an accuracy scorer uses the old row as it is; a margin scorer evaluates it again and stores values
        calls = []

        def evaluator(sets, start, stop):
            calls.append((len(sets), start, stop))
            return np.tile(bits[start:stop], (len(sets), 1)), np.tile(values[start:stop], (len(sets), 1))

        assert np.array_equal(Scorer(j, "discovery", 40, lambda s, a, b: bits[a:b][None]).bits(()), bits)
        margin = Scorer(j, "discovery", 40, evaluator, objective="margin")
        assert margin.known(()) == 0
        margin.ensure([()])
        assert calls == [(1, 0, 40)] and np.allclose(margin.values(()), values)
    with sqlite3.connect(old) as db:
        assert db.execute("SELECT value FROM meta WHERE key='format'").fetchone()[0] == str(JOURNAL_FORMAT)
    with Journal(old) as j:
        assert np.array_equal(j.get("discovery", "").values, values)
    newer = tmp_path / "newer.sqlite"
    _write_format1_journal(newer, bits)
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE meta SET value = ? WHERE key='format'", (str(JOURNAL_FORMAT + 1),))
    with pytest.raises(Exception, match="newer than this headedit"):
        Journal(newer)


def test_recipe_objective_and_alpha_are_validated():
    base = recipe_toml(model="m", task="boolq", discovery={})
    assert parse_recipe(base).discovery.objective == "margin"
    assert parse_recipe(base + 'objective = "logprob"\nalpha = 1.0').discovery.alpha == 1.0
    assert parse_recipe(base.replace('"boolq"\n', '"boolq"\ndiscovery = 300\n') + "screen_rows = 100").discovery.screen_rows == 100
    for bad, field in (('objective = "loss"', "discovery.objective"), ("objective = 1", "discovery.objective"),
                       ("alpha = 0", "discovery.alpha"), ("alpha = 1.5", "discovery.alpha"),
                       ('alpha = "x"', "discovery.alpha"), ("screen_rows = -1", "discovery.screen_rows"),
                       ("screen_rows = 2000", "discovery.screen_rows")):
        with pytest.raises(RecipeError) as err:
            parse_recipe(base + bad)
        assert field in str(err.value) and "\n" not in str(err.value)


def test_gradient_screen_attributes_the_margin(tmp_path):
    """Attribution under the margin objective = the margin's directional derivative (finite differences)."""
    from headedit.discovery.gradient import gradient_screen

    model = tiny_model(dtype=torch.float64, num_hidden_layers=2, seed=1)
    engine = Engine(model, tiny_tokenizer(), batch_size=8)
    layout = HeadLayout.from_model(model)
    task = get_task("coin-test")
    examples = list(task.load("discovery", 16).examples)
    scorer = Scorer(Journal(tmp_path / "j.sqlite"), "discovery", len(examples),
                    lambda sets, a, b: engine.evaluate(task, examples[a:b], sets, "margin"), objective="margin")
    screen = gradient_screen(engine, task, examples, scorer, layout)
    assert "margin" in screen.rule and screen.extra["objective"] == "margin"

    def total_margin(layer: int, head: int, factor: float) -> float:
        o_proj = model.get_submodule(layout.o_proj_path(layer))
        cols = slice(head * layout.head_dim, (head + 1) * layout.head_dim)
        saved = o_proj.weight[:, cols].clone()
        with torch.no_grad():
            o_proj.weight[:, cols] *= factor
        try:
            return float(plain_values(model, tiny_tokenizer(), task, examples, ())["margin"].sum())
        finally:
            with torch.no_grad():
                o_proj.weight[:, cols] = saved

    eps = 1e-3
    for layer, head in [(0, 0), (0, 3), (1, 1)]:
        derivative = (total_margin(layer, head, 1 - eps) - total_margin(layer, head, 1 + eps)) / (2 * eps)
        predicted = screen.delta[layer][head] * len(examples)
        assert abs(predicted - derivative) <= 2e-3 * max(1.0, abs(derivative)), (layer, head, predicted, derivative)


def test_validation_summary_of_the_objective():
    rng = np.random.default_rng(1)
    a = rng.normal(size=500)
    s = summary("margin", a, a + 0.2 + rng.normal(scale=0.5, size=500))
    assert s["name"] == "margin" and s["n"] == 500 and s["ci"][0] < s["gain"] < s["ci"][1]
    assert 0.1 < s["gain"] < 0.3 and s["p_one_sided"] < 1e-10
    flat = summary("logprob", a, a)
    assert flat["gain"] == 0.0 and flat["p_one_sided"] == 1.0


def test_sharded_evaluator_carries_the_objective(monkeypatch):
    """Shard.wrap with values: a one-process gloo group gathers (bits, values) as the scorer expects."""
    import torch.distributed as dist

    from headedit.pipeline.parallel import Shard

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rng = np.random.default_rng(2)
        bits, values = rng.random((3, 10)) < 0.5, rng.normal(size=(3, 10)).astype(np.float32)

        def evaluator(sets, start, stop):
            return bits[: len(sets), start:stop], values[: len(sets), start:stop]

        got_bits, got_values = Shard("cpu").wrap(evaluator, with_values=True)([(), (), ()], 2, 9)
        assert np.array_equal(got_bits, bits[:, 2:9]) and np.array_equal(got_values, values[:, 2:9])
        plain = Shard("cpu").wrap(lambda sets, a, b: bits[: len(sets), a:b])([(), ()], 0, 10)
        assert np.array_equal(plain, bits[:2])
    finally:
        dist.destroy_process_group()
