"""Layer-prefix reuse: starting at layer L from cached intact states is bit-identical (fp32) to a full forward."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headedit.ablation import ablate
from headedit.bench_eval import synthetic_boolq
from headedit.engine import Engine
from headedit.engine_batch import make_batches
from headedit.engine_prefix import HiddenCache, run_decoder
from headedit.heads import Head, HeadLayout
from headedit.tasks import get_task
from headedit.tiny import tiny_model, tiny_tokenizer


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
