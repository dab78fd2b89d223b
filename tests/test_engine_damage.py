"""General-damage check: KL(intact || edited) of next-token distributions on the packaged neutral text."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headedit.engine.damage import kl_per_position, measure, neutral_passages, reference
from headedit.export.bake import bake
from headedit.model.ablation import ablate
from headedit.model.heads import parse_heads
from headedit.model.loading import load_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo():
    model, tokenizer, layout = load_model("headedit:demo")
    return model, tokenizer, layout, reference(model, tokenizer)


def test_neutral_text_is_packaged_with_its_source() -> None:
    passages = neutral_passages()
    assert len(passages) == 12 and all(len(p.split()) >= 40 for p in passages)
    header = (ROOT / "headedit" / "data" / "neutral.txt").read_text().splitlines()[:3]
    assert any("Written for headedit" in line for line in header)


def test_kl_matches_the_definition() -> None:
    p = torch.log(torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4]]))
    q = torch.log(torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]]))
    kl = kl_per_position(p, q)
    assert kl[0].item() == pytest.approx(0.5 * math.log(2.0) + 0.25 * 0 + 0.25 * 0, abs=1e-7)  # 0 log 0 = 0
    assert kl[1].item() == 0.0


def test_kl_is_zero_for_an_empty_head_set(demo) -> None:
    model, tokenizer, _, ref = demo
    assert ref.logprobs.shape == (512, 43)  # 512 predicted positions x the demo's 43-token vocabulary
    with ablate(model, heads=()):
        same = measure(ref, model, tokenizer)
    assert same["kl_mean"] == 0.0 and same["kl_max"] == 0.0 and same["tokens"] == 512


def test_kl_is_positive_for_a_real_ablation_and_baked_equals_hooked(demo, tmp_path: Path) -> None:
    model, tokenizer, layout, ref = demo
    heads = parse_heads("0.0,1.1", layout)
    baked_dir = bake("headedit:demo", "0.0,1.1", tmp_path / "baked")
    baked, baked_tok, _ = load_model(str(baked_dir))
    from_checkpoint = measure(ref, baked, baked_tok)
    with ablate(model, layout, heads):  # the same edit as forward hooks on the intact model
        from_hooks = measure(ref, model, tokenizer)
    assert from_checkpoint["kl_mean"] > 0.01 and from_checkpoint["kl_max"] >= from_checkpoint["kl_mean"]
    assert from_checkpoint["kl_mean"] == pytest.approx(from_hooks["kl_mean"], rel=1e-4, abs=1e-7)
    with ablate(model, layout, parse_heads("1.3", layout)):  # a head the screen calls idle moves little
        idle = measure(ref, model, tokenizer)
    assert 0.0 < idle["kl_mean"] < from_checkpoint["kl_mean"]


@pytest.mark.slow
def test_demo_reports_the_damage_in_its_table_validation_json_and_card(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "headedit", "demo", "--runs", str(tmp_path / "runs"), "--out",
                           str(tmp_path / "export")], cwd=tmp_path, text=True, capture_output=True, timeout=900,
                          env={**__import__("os").environ, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = " ".join(proc.stdout.split())
    assert "general damage: KL(intact || edited) of next-token distributions on neutral text =" in out
    validation = json.loads(next((tmp_path / "runs").glob("demo-*/validation.json")).read_text())
    damage = validation["damage"]
    assert damage["kl_mean"] > 0 and damage["tokens"] == 512 and "neutral.txt" in damage["source"]
    assert f"{damage['kl_mean']:.4f} nats/token" in out
    card = (tmp_path / "export" / "README.md").read_text()
    assert "General damage" in card and f"{damage['kl_mean']:.4f} nats per token" in card
