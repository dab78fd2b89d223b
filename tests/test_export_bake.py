"""The bake: hook-ablated logits == baked, reloaded logits exactly, on every small family; only the named
columns change; shards kept; outputs never half-written, never inside the source; tampering detected."""
from __future__ import annotations

import json

import pytest
import torch
from testkit.files import tree_digest
from testkit.models import FAMILIES, family_model, save_model
from testkit.zoo import check_only_slices_changed
from transformers import AutoModelForCausalLM

from headedit import HeadLayout, ablate, parse_heads
from headedit.errors import ExportError, OutputExistsError
from headedit.export.bake import bake, verify_export

INPUT = torch.tensor([[1, 5, 9, 13, 2, 7, 40, 3], [4, 4, 8, 15, 16, 23, 42, 11]])


def logits(model, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT, **kw).logits


# ---- the key invariant: hook ablation == baked reloaded checkpoint -----------------------
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_hook_ablation_equals_baked_checkpoint(arch, tmp_path):
    model = family_model(arch)
    src = save_model(model, tmp_path / "src")
    heads = parse_heads("0.1,1.0,1.3,2.2")
    layout = HeadLayout.from_model(model)
    intact = logits(model)
    with ablate(model, layout, heads=heads):
        hooked = logits(model)
    assert not torch.equal(hooked, intact)
    assert torch.equal(logits(model), intact)  # hooks gone after the block
    out = bake(src, "0.1,1.0,1.3,2.2", tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert torch.equal(logits(reloaded), hooked)


# ---- bake file guarantees ------------------------------------------------------------------
def test_bake_changes_only_named_columns_and_keeps_sharding(tmp_path):
    model = family_model("llama")
    src = save_model(model, tmp_path / "src", max_shard_size="20KB")
    assert (src / "model.safetensors.index.json").is_file()
    before = tree_digest(src)
    out = bake(src, "1.2,2.0", tmp_path / "out")
    assert tree_digest(src) == before  # source untouched
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in out.glob("*.safetensors")}
    # every tensor byte-identical except the two heads' columns, which are +0
    assert check_only_slices_changed(src, out, HeadLayout.from_model(model), parse_heads("1.2,2.0")) == 2
    manifest = verify_export(out)
    assert manifest["heads"] == "1.2,2.0"
    assert set(manifest["source"]["files"]) == {p.name for p in src.glob("*.safetensors")}


def test_bake_refuses_existing_output_and_leaves_no_temp(tmp_path):
    src = save_model(family_model("llama"), tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        bake(src, "0.1", out)
    assert (out / "keep.txt").read_text() == "mine"
    bake(src, "0.1", out, force=True)
    assert not (out / "keep.txt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_bake_into_source_folder_refused(tmp_path):
    src = save_model(family_model("llama"), tmp_path / "src")
    with pytest.raises(OutputExistsError, match="overlaps the source"):
        bake(src, "0.1", src / "edited", force=True)


def test_verify_export_detects_tampering(tmp_path):
    src = save_model(family_model("llama"), tmp_path / "src")
    out = bake(src, "0.1", tmp_path / "out")
    with open(out / "config.json", "a") as fh:
        fh.write(" ")
    with pytest.raises(ExportError, match="config.json no longer matches"):
        verify_export(out)


def test_rebake_keeps_earlier_heads(tmp_path):
    src = save_model(family_model("llama"), tmp_path / "src")
    first = bake(src, "0.1", tmp_path / "a")
    second = bake(first, "2.3", tmp_path / "b")
    assert json.loads((second / "headedit.json").read_text())["heads"] == "0.1,2.3"


