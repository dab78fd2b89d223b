"""Engine exactness: every fast path against the plain reference path, on a tiny random Llama."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from headedit.bench.eval import synthetic_boolq, synthetic_hellaswag
from headedit.bench.tiny import tiny_model, tiny_tokenizer
from headedit.engine.batch import encode_pair
from headedit.engine.core import Engine
from headedit.engine.generate import greedy_generate
from headedit.engine.reference import reference_correctness
from headedit.model.heads import Head, HeadLayout
from headedit.tasks import get_task
from headedit.tasks.base import Example, Task

SETS = [(), (Head(0, 1),), (Head(1, 2),), (Head(0, 0), Head(1, 3)), (Head(1, 0), Head(1, 1))]


@pytest.fixture(scope="module")
def tiny():
    model = tiny_model(init_scale=0.3)
    return model, tiny_tokenizer(), HeadLayout.from_model(model)


class SelfExact(Task):
    """Exact match whose targets are the intact model's own greedy tokens, so results are a real mix."""

    name = "self-exact"
    kind = "exact"


class HashGenerate(Task):
    """Generated task whose verdict is a hash bit of the whole text: equal verdicts need equal texts."""

    name = "hash-generate"
    kind = "generate"
    max_new_tokens = 6
    stop = ("\n",)

    def check(self, example: Example, generated: str) -> bool:
        return hashlib.sha256(generated.encode()).digest()[0] % 2 == 0


def self_examples(model, tok, n=10, k=3):
    prompts = [e.prompt for e in get_task("arithmetic").load("discovery", 40).examples]
    out = []
    for p in prompts:
        ctx = tok(p)["input_ids"]
        gen = greedy_generate(model, tok, ctx, k, ())
        text = tok.decode(gen, skip_special_tokens=False)
        if text.strip() != text or tok.eos_token in text or encode_pair(tok, p, text, True)[1] != gen:
            continue  # keep targets that tokenize back to exactly the greedy tokens
        out.append(Example(len(out), p, target=text))
        if len(out) == n:
            break
    assert len(out) >= min(n, 4)
    return out


def test_teacher_forced_exact_match_agrees_with_generate(tiny):
    model, tok, layout = tiny
    task = SelfExact()
    examples = self_examples(model, tok) + list(get_task("arithmetic").load("heldout", 4).examples)
    engine = Engine(model, tok, layout, batch_size=4)
    got = engine.correctness(task, examples, SETS)
    for s, hs in enumerate(SETS):
        assert list(got[s]) == list(reference_correctness(model, tok, layout, task, examples, hs)), hs
    assert got[0, :5].all() and not got.all()  # intact gets its own greedy right; ablation breaks some


def test_single_token_choices_equal_one_forward_per_choice(tiny):
    model, tok, layout = tiny
    task = get_task("boolq")
    examples = synthetic_boolq(8)
    plan = Engine(model, tok, layout).plan(task, examples[0])[0]
    assert len(plan.gathers) == 2 and len(plan.tokens) == plan.context_len  # one forward, no choice tokens
    got = Engine(model, tok, layout, batch_size=3).correctness(task, examples, SETS)
    for s, hs in enumerate(SETS):
        assert list(got[s]) == list(reference_correctness(model, tok, layout, task, examples, hs))


def _choice_scores(model, tok, ex, hs, layout):
    from headedit.model.ablation import ablate

    scores = []
    ctx = tok(ex.prompt)["input_ids"]
    with ablate(model, layout, heads=hs), torch.no_grad():
        for choice in ex.choices:
            cont = encode_pair(tok, ex.prompt, choice, True)[1]
            logp = torch.log_softmax(model(input_ids=torch.tensor([ctx + cont])).logits[0].float(), -1)
            scores.append(sum(float(logp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)))
    return scores


def test_packed_endings_equal_one_forward_per_ending(tiny):
    model, tok, layout = tiny
    task = get_task("hellaswag")
    examples = synthetic_hellaswag(6)
    engine = Engine(model, tok, layout, batch_size=4)
    plan = engine.plan(task, examples[0])[0]
    assert plan.segments is not None and plan.tokens[: plan.context_len] == tuple(tok(examples[0].prompt)["input_ids"])
    got = engine.correctness(task, examples, SETS)
    for s, hs in enumerate(SETS):
        assert list(got[s]) == list(reference_correctness(model, tok, layout, task, examples, hs))
    # log-likelihoods themselves, not only the decisions
    raw = engine.score_plans(engine.plans(task, examples), [SETS[3]])[0]
    for batch, sc in raw:
        for m in batch.members:
            mine = [sum(sc.logprob[i] for i, (mm, g) in enumerate(zip(batch.gather_member, batch.gather_group))
                        if mm == m and g == k) for k in range(4)]
            np.testing.assert_allclose(mine, _choice_scores(model, tok, examples[m], SETS[3], layout), atol=1e-4)


def test_packed_sets_equal_one_set_at_a_time(tiny):
    model, tok, layout = tiny
    task = get_task("boolq")
    examples = synthetic_boolq(5)
    packed = Engine(model, tok, layout, batch_size=5, max_rows=40, prefix_reuse=False)
    single = Engine(model, tok, layout, batch_size=5, prefix_reuse=False)
    plans = packed.plans(task, examples)
    raw_packed = packed.score_plans(plans, SETS[1:])
    forwards = packed.forwards
    assert forwards < len(SETS) - 1  # several sets shared a forward
    for s, hs in enumerate(SETS[1:]):
        (batch, one), = single.score_plans(single.plans(task, examples), [hs])[0]
        np.testing.assert_allclose(raw_packed[s][0][1].logprob, one.logprob, rtol=0, atol=1e-5)
        assert np.array_equal(raw_packed[s][0][1].argmax, one.argmax)
    assert np.array_equal(packed.correctness(task, examples, SETS), single.correctness(task, examples, SETS))


def test_drafted_generation_equals_plain_greedy_generation(tiny):
    model, tok, layout = tiny
    task = HashGenerate()
    examples = list(get_task("arithmetic").load("discovery", 8).examples)
    engine = Engine(model, tok, layout, batch_size=4)
    got = engine.correctness(task, examples, SETS)
    for s, hs in enumerate(SETS):
        assert list(got[s]) == list(reference_correctness(model, tok, layout, task, examples, hs)), hs
    assert 0 < got.sum() < got.size
    before = engine.forwards
    again = engine.correctness(task, examples, [()])
    assert engine.forwards == before and list(again[0]) == list(got[0])  # intact drafts are cached


def test_chat_format_with_template_kwargs(tiny):
    model, tok, layout = tiny
    task = SelfExact()
    engine = Engine(model, tok, layout, chat_template_kwargs={"enable_thinking": False})
    ex = Example(0, "Question: What is 1 plus 1?\nAnswer:", target=" 2")
    plan, conts = engine.plan(task, ex)
    text = tok.decode(plan.tokens)
    assert text.startswith("<|im_start|>user\nQuestion") and "<think>\n\n</think>\n2" in text
    assert conts[0][-1] == tok.eos_token_id  # the stop token must be the argmax too
    examples = [Example(i, e.prompt, target=e.target) for i, e in enumerate(self_examples(model, tok, 4))]
    got = engine.correctness(task, examples, SETS[:3])
    for s, hs in enumerate(SETS[:3]):
        ref = reference_correctness(model, tok, layout, task, examples, hs, chat=True,
                                    chat_template_kwargs={"enable_thinking": False})
        assert list(got[s]) == list(ref)


def test_answer_batches_give_the_answer_logprob(tiny):
    model, tok, layout = tiny
    task = get_task("hellaswag")
    examples = synthetic_hellaswag(3)
    engine = Engine(model, tok, layout, batch_size=2)
    totals = np.zeros(len(examples))
    with torch.no_grad():
        for tb in engine.answer_batches(task, examples):
            logits = model(input_ids=tb.input_ids, attention_mask=tb.attention_mask, position_ids=tb.position_ids).logits
            lp = torch.log_softmax(logits[tb.row, tb.position].float(), -1).gather(1, tb.target[:, None])[:, 0]
            for e, v in zip(tb.example, lp.tolist()):
                totals[e] += v
    for i, ex in enumerate(examples):
        assert totals[i] == pytest.approx(_choice_scores(model, tok, ex, (), layout)[ex.label], abs=1e-4)


def test_bad_heads_are_rejected(tiny):
    from headedit.errors import HeadSpecError

    model, tok, layout = tiny
    with pytest.raises(HeadSpecError):
        Engine(model, tok, layout).correctness(get_task("boolq"), synthetic_boolq(1), [(Head(9, 0),)])


def test_batched_tokenization_gives_the_same_plans(tiny):
    model, tok, layout = tiny
    cases = [(get_task("boolq"), synthetic_boolq(6)), (get_task("hellaswag"), synthetic_hellaswag(4)),
             (get_task("arithmetic"), list(get_task("arithmetic").load("discovery", 6).examples)),
             (HashGenerate(), list(get_task("arithmetic").load("discovery", 3).examples))]
    for task, examples in cases:
        for kwargs in ({}, {"chat_template_kwargs": {"enable_thinking": False}}):
            batched = Engine(model, tok, layout, **kwargs).plans(task, examples)  # one batched tokenizer call
            single = [Engine(model, tok, layout, **kwargs).plan(task, ex)[0] for ex in examples]
            assert batched == single, (task.name, kwargs)


class CountingGenerate(HashGenerate):
    """HashGenerate with a batched checker that counts its calls (as MBPP's `check_many`)."""

    name = "counting-generate"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def check_many(self, examples, generations, workers=None):
        self.calls.append(len(generations))
        return [self.check(ex, g) for ex, g in zip(examples, generations)]


def test_generated_rows_are_checked_with_check_many(tiny):
    model, tok, layout = tiny
    task = CountingGenerate()
    examples = list(get_task("arithmetic").load("discovery", 8).examples)
    engine = Engine(model, tok, layout, batch_size=4)
    got = engine.correctness(task, examples, SETS)
    assert len(task.calls) == 2 and task.calls[0] == len(examples)  # the drafts, then every diverging row at once
    for s, hs in enumerate(SETS):
        assert list(got[s]) == list(reference_correctness(model, tok, layout, task, examples, hs)), hs


def test_scores_reach_the_host_in_one_transfer_with_every_slice_in_place() -> None:
    from headedit.engine.scores import RawScores, to_host

    a = RawScores(torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.tensor([3, 4]))
    b = RawScores(torch.tensor([-5.0], dtype=torch.float64), torch.tensor([7]))
    done = RawScores(np.array([-9.0]), np.array([1]))  # already on the host: left alone
    to_host([a, b, done])
    assert isinstance(a.logprob, np.ndarray) and isinstance(b.argmax, np.ndarray)
    assert a.logprob.tolist() == [-1.0, -2.0] and a.argmax.tolist() == [3, 4]
    assert b.logprob.tolist() == [-5.0] and b.argmax.tolist() == [7]
    assert done.logprob.tolist() == [-9.0]
