"""Layer-prefix reuse: starting at layer L from cached intact states is bit-identical (fp32) to a full forward."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headedit.bench.eval import synthetic_boolq
from headedit.bench.tiny import tiny_model, tiny_tokenizer
from headedit.engine.batch import make_batches
from headedit.engine.core import Engine
from headedit.engine.prefix import HiddenCache, run_decoder
from headedit.model.ablation import ablate
from headedit.model.heads import Head, HeadLayout
from headedit.tasks import get_task


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_run_from_layer_is_bit_identical(arch):
    model = tiny_model(arch, num_hidden_layers=3)
    tok = tiny_tokenizer()
    layout = HeadLayout.from_model(model)
    engine = Engine(model, tok, layout)
    batch = make_batches(engine.plans(get_task("boolq"), synthetic_boolq(3)), 3, engine.pad_id, torch.float32, "cpu")[0]
    assert batch.attention_mask.min() == 0  # padded rows present
    with torch.no_grad():
        full, captured = run_decoder(model, batch.input_ids, batch.attention_mask, capture=[1, 2])
        for layer in (1, 2):
            with ablate(model, layout, heads=[Head(layer, 1)]):
                ref, _ = run_decoder(model, batch.input_ids, batch.attention_mask)
                fast, _ = run_decoder(model, batch.input_ids, batch.attention_mask, start_layer=layer,
                                      hidden_in=captured[layer])
            assert torch.equal(ref, fast)
        plain = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    assert torch.equal(full, plain)
    assert all(not isinstance(m, type(None)) for m in model.get_decoder().layers)  # layers restored
    assert type(model.get_decoder().layers[0]).__name__.endswith("DecoderLayer")


def test_engine_prefix_reuse_matches_full_forwards():
    model = tiny_model(num_hidden_layers=3)
    tok, layout = tiny_tokenizer(), HeadLayout.from_model(model)
    task, examples = get_task("boolq"), synthetic_boolq(6)
    sets = [(), (Head(1, 0),), (Head(2, 3),), (Head(1, 1), Head(2, 2)), (Head(0, 0),)]
    fast, slow = Engine(model, tok, layout, batch_size=4), Engine(model, tok, layout, batch_size=4, prefix_reuse=False)
    a = fast.score_plans(fast.plans(task, examples), sets)
    b = slow.score_plans(slow.plans(task, examples), sets)
    for x, y in zip(a, b):
        for (_, sx), (_, sy) in zip(x, y):
            assert np.array_equal(sx.logprob, sy.logprob) and np.array_equal(sx.argmax, sy.argmax)
    assert fast.hidden.misses and fast.hidden._items  # states were cached ...
    before = fast.forwards
    fast.score_plans(fast.plans(task, examples), sets[1:3])
    assert fast.forwards - before == 2 * 2  # ... and reused: only the ablated forwards ran again (2 batches)


def test_hidden_cache_is_bounded():
    cache = HiddenCache(max_bytes=3 * 400)
    for i in range(5):
        cache.put(("k", i), torch.zeros(100))  # 400 bytes each
    assert cache.get(("k", 0)) is None and cache.get(("k", 4)) is not None and len(cache._items) == 3


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_first_layer_attention_from_cached_o_proj_input_is_bit_identical(arch):
    model = tiny_model(arch, num_hidden_layers=3)
    tok = tiny_tokenizer()
    layout = HeadLayout.from_model(model)
    engine = Engine(model, tok, layout)
    batch = make_batches(engine.plans(get_task("boolq"), synthetic_boolq(3)), 3, engine.pad_id, torch.float32, "cpu")[0]
    with torch.no_grad():
        _, captured = run_decoder(model, batch.input_ids, batch.attention_mask, capture=[1, 2], capture_attn=[0, 1, 2])
        for layer in (0, 1, 2):
            with ablate(model, layout, heads=[Head(layer, 1), Head(2, 3)]):
                ref, _ = run_decoder(model, batch.input_ids, batch.attention_mask)
                fast, _ = run_decoder(model, batch.input_ids, batch.attention_mask, start_layer=layer,
                                      hidden_in=captured.get(layer), attn_in=captured[("attn", layer)])
            assert torch.equal(ref, fast), layer
    assert all(type(layer.self_attn).__name__.endswith("Attention") for layer in model.get_decoder().layers)


def test_last_layer_mlp_only_at_read_positions():
    model = tiny_model(num_hidden_layers=2)
    engine = Engine(model, tiny_tokenizer())
    batch = make_batches(engine.plans(get_task("boolq"), synthetic_boolq(4)), 4, engine.pad_id, torch.float32, "cpu")[0]
    at = (batch.gather_row, batch.gather_pos)
    with torch.no_grad():
        full, _ = run_decoder(model, batch.input_ids, batch.attention_mask)
        part, _ = run_decoder(model, batch.input_ids, batch.attention_mask, read_at=at)
    torch.testing.assert_close(part[at], full[at], rtol=0, atol=1e-6)
    assert not torch.equal(part, full)  # elsewhere the final states were not computed
    assert type(model.get_decoder().layers[-1].mlp).__name__.endswith("MLP")  # restored


def test_fast_engine_on_search_sets_equals_plain_engine_across_chunks():
    model = tiny_model(num_hidden_layers=3, init_scale=0.3)
    tok, layout = tiny_tokenizer(), HeadLayout.from_model(model)
    task, examples = get_task("boolq"), synthetic_boolq(24)
    a, b, c = Head(0, 1), Head(1, 2), Head(2, 3)
    sets = [(), (a,), (b,), (c,), (a, b), (a, c), (a, Head(1, 0)), (a, b, c), (Head(1, 0), c)]
    fast = Engine(model, tok, layout, batch_size=16, max_rows=64)
    plain = Engine(model, tok, layout, batch_size=8, prefix_reuse=False)
    evaluate = fast.range_eval(task, examples, block=8, doubling=True)
    got = np.concatenate([evaluate(sets, 0, 8), evaluate(sets, 8, 16), evaluate(sets, 16, 24)], axis=1)
    assert np.array_equal(got, plain.correctness(task, examples, sets))
    assert fast.attn_skip and fast._attn_checked  # the o_proj-only first layer passed its self-check
    assert any(key[1] for key in fast.hidden._items)  # a shared node under a non-empty base was cached
    before = fast.forwards
    assert np.array_equal(evaluate(sets[1:4], 8, 24), got[1:4, 8:])
    assert fast.forwards - before == 2 * 3  # cached starts: one forward per start layer, per batch of [8, 24)
    fast.gathered_mlp = fast.attn_skip = False  # each shortcut off: same verdicts
    assert np.array_equal(evaluate(sets, 0, 24), got)
