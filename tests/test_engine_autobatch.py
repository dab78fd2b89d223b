"""Automatic batch size: doubling/bisection against a memory budget (a probe that raises torch's real
OutOfMemoryError above a threshold), the real engine probe, and the size kept in run.json across a resume."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import testkit.coin  # noqa: F401  (registers coin-test)
import torch

from headedit.bench.tiny import tiny_model, tiny_tokenizer  # noqa: E402
from headedit.engine.autobatch import (  # noqa: E402
    CPU_BATCH,
    SAFETY,
    BatchSizeError,
    engine_probe,
    is_oom,
    largest_that_fits,
    resolve_batch,
)
from headedit.engine.core import Engine  # noqa: E402
from headedit.model.heads import Head  # noqa: E402
from headedit.runs import Run  # noqa: E402
from headedit.tasks import get_task  # noqa: E402

torch.set_num_threads(1)


def budget(threshold: int, calls: list[int] | None = None):
    """A device that fits at most `threshold` examples per batch."""
    def probe(n: int) -> None:
        if calls is not None:
            calls.append(n)
        if n > threshold:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for {n} rows")
    return probe


@pytest.mark.parametrize("threshold", [1, 2, 7, 8, 9, 63, 100, 1000, 1024, 5000])
def test_largest_that_fits_finds_the_budget(threshold: int) -> None:
    calls: list[int] = []
    fit, tried = largest_that_fits(budget(threshold, calls), start=8, limit=1024)
    assert fit == min(threshold, 1024)
    assert tried == calls and max(tried) <= 1024
    assert len(tried) <= 2 * 11  # doubling + bisection: logarithmic, not linear
    assert fit in tried  # the answer was actually probed


def test_nothing_fits_and_other_errors_propagate() -> None:
    with pytest.raises(BatchSizeError, match="not even one example"):
        largest_that_fits(budget(0))

    def broken(n: int) -> None:
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError):
        largest_that_fits(broken)
    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert is_oom(torch.OutOfMemoryError("x")) and not is_oom(RuntimeError("shape mismatch"))


@pytest.fixture(scope="module")
def engine_and_data():
    model = tiny_model(num_hidden_layers=3, hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    engine = Engine(model, tiny_tokenizer(), batch_size=4, max_rows=8)
    task = get_task("coin-test")
    examples = list(task.load("discovery", 24, 0).examples)
    return engine, task, examples


def test_engine_probe_runs_the_engine_and_leaves_results_unchanged(engine_and_data) -> None:
    engine, task, examples = engine_and_data
    sets = [(), (Head(1, 2),), (Head(0, 0), Head(2, 3))]
    before = engine.correctness(task, examples, sets)
    probe = engine_probe(engine, task, examples, reserve_bytes=1 << 16)
    forwards = engine.forwards
    probe(6)
    assert engine.forwards > forwards  # real forwards ran
    assert engine.max_rows == 12  # the engine's packing ratio (8 rows / 4 examples) is kept
    engine.batch_size, engine.max_rows = 4, 8
    assert np.array_equal(engine.correctness(task, examples, sets), before)


def test_resolve_batch_probes_once_and_a_resume_reuses_run_json(tmp_path, engine_and_data) -> None:
    engine, task, examples = engine_and_data
    run = Run.create(tmp_path / "run", 'name = "x"\n', {"name": "x"})
    calls: list[int] = []
    real = engine_probe(engine, task, examples, reserve_bytes=0)

    def fake_budget_then_real(n: int) -> None:  # OOM above 37 examples; below it, the real engine probe
        budget(37, calls)(n)
        real(min(n, len(examples)))

    record = resolve_batch(engine, "auto", task, examples, run, probe=fake_budget_then_real, limit=256)
    assert record["source"] == "probed" and record["largest_fit"] == 37
    assert record["batch_size"] == int(37 * SAFETY) == engine.batch_size
    assert engine.max_rows == 2 * engine.batch_size  # packing ratio kept
    assert Run.open(run.path).info["batch"] == record
    assert calls and max(calls) > 37

    def must_not_probe(n: int) -> None:
        raise AssertionError("a resumed run re-probed")

    engine.batch_size, engine.max_rows = 4, 8
    again = resolve_batch(engine, "auto", task, examples, Run.open(run.path), probe=must_not_probe)
    assert again == record and engine.batch_size == record["batch_size"]


def test_fixed_sizes(engine_and_data) -> None:
    engine, task, examples = engine_and_data
    assert resolve_batch(engine, 5, task, examples)["batch_size"] == 5 == engine.batch_size
    cpu = resolve_batch(engine, "auto", task, examples)  # CPU: no probing, a fixed default
    assert cpu == {"batch_size": CPU_BATCH, "source": "default on cpu"} and engine.batch_size == CPU_BATCH


# ---- the GPU benchmark, smoke-tested on CPU ---------------------------------------------------------
def test_flop_counter_matches_torch_flop_counter() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from headedit.bench.gpu import FlopCounter, build_model
    from headedit.model.heads import HeadLayout

    model, _ = build_model(None, "cpu", torch.float32, tiny=True)
    model.set_attn_implementation("eager")  # torch counts eager attention's matmuls; sdpa's CPU kernel it does not
    counter = FlopCounter(model, HeadLayout.from_model(model))
    ids = torch.randint(3, 300, (3, 40))  # [batch, pos]
    with FlopCounterMode(display=False) as reference:
        model(input_ids=ids)
    counter.close()
    assert counter.flops == reference.get_total_flops() > 0


def test_bench_gpu_tiny_runs_on_cpu(capsys) -> None:
    from headedit.cli import main

    code = main(["bench", "gpu", "--tiny", "--n", "16", "--naive-n", "4", "--naive-sets", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.strip().splitlines()
    assert "9 sets (intact + every head alone)" in out and "TFLOP/s executed" in out
    assert lines[-1].startswith("fast/naive: ") and lines[-1].endswith("identical: yes")
    assert main(["bench", "gpu", "--tiny", "--n", "4", "--naive-n", "8"]) == 2  # bad input: one line, exit 2


def test_bench_gpu_builds_smollm3_at_full_shapes_on_meta() -> None:
    """The non-tiny path: the real SmolLM3-3B config, full depth, on the meta device (shapes, no memory)."""
    import os

    from headedit.bench.gpu import DEFAULT_CONFIG, build_model
    from headedit.model.heads import HeadLayout

    if "HEADEDIT_DATA_DIR" not in os.environ:
        pytest.skip("HEADEDIT_DATA_DIR not set")
    config = Path(os.environ["HEADEDIT_DATA_DIR"]).parent / "tokenizers" / DEFAULT_CONFIG
    model, label = build_model(config, "meta", torch.bfloat16, tiny=False)
    layout = HeadLayout.from_model(model)
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads, layout.head_dim) == (36, 16, 4, 128)
    assert model.config._attn_implementation == "sdpa" and model.dtype == torch.bfloat16
    params = sum(p.numel() for p in model.parameters())
    assert 3.0e9 < params < 3.2e9  # SmolLM3-3B: 3.08B parameters, vocabulary 128,256
    assert "36 layers" in label
