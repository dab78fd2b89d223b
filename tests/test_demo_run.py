"""`headedit demo` end to end: the CEL effect shows on held-out, and the export is exactly the hooked model."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from headedit import ablate, parse_heads
from headedit.export.bake import verify_export
from headedit.model.loading import load_model


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    res = subprocess.run(
        [sys.executable, "-m", "headedit", "demo", "--runs", str(root / "runs"), "--out", str(root / "export")],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return root, res.stdout


def test_demo_prints_paper_table_and_ends_with_export(demo_run):
    root, out = demo_run
    lines = [line for line in out.strip().splitlines() if line.strip()]
    assert lines[-1] == f"export: {root / 'export'}"
    for needle in ("intact", "edited", "gain", "RER", "95% CI", "McNemar", "side: copy-first", "L\\H"):
        assert needle in out, needle


def test_demo_gain_holds_on_heldout_and_side_task_pays(demo_run):
    root, _ = demo_run
    result = json.loads((root / "export" / "validation.json").read_text())
    assert result["task"] == "copy-second" and result["n"] == 2000
    assert result["gain_points"] >= 50
    assert result["ci95_points"][0] > 0
    assert result["mcnemar_p"] < 1e-6
    assert result["passed"] is True
    side = {row["task"]: row for row in result["side_tasks"]}
    assert side["copy-first"]["gain_points"] < -50  # the edit trades one behaviour for the other


def test_demo_export_equals_hook_ablated_model(demo_run):
    root, _ = demo_run
    export = root / "export"
    manifest = verify_export(export)
    heads = parse_heads(manifest["heads"])
    assert heads and (export / "README.md").is_file() and (export / "heads.png").is_file()
    model, tokenizer, layout = load_model("headedit:demo")
    ids = tokenizer(["<bos>A 12+34=", "<bos>A 98+07="], add_special_tokens=False, return_tensors="pt").input_ids
    with ablate(model, layout, heads=heads), torch.no_grad():
        hooked = model(input_ids=ids).logits
    reloaded = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, hooked)
