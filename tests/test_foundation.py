"""The correctness core: head geometry, hook ablation == baked checkpoint, bake file guarantees, CLI errors."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from headedit import Head, HeadLayout, ablate, format_heads, parse_heads
from headedit.errors import ExportError, HeadSpecError, OutputExistsError, UnsupportedModelError
from headedit.export.bake import bake, verify_export
from headedit.model.ablation import heads_to_mask

ARCHS = {
    # name: (config class path, extra kwargs)
    "llama": ("LlamaConfig", {}),
    "llama-gqa": ("LlamaConfig", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2}),
    "qwen3-headdim": ("Qwen3Config", {"num_key_value_heads": 2, "head_dim": 12}),  # head_dim != hidden/heads
    "smollm3": ("SmolLM3Config", {"num_key_value_heads": 2}),
}


def make_model(arch: str, seed: int = 0):
    import transformers

    cls_name, extra = ARCHS[arch]
    kwargs = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=64, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    kwargs.update(extra)
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    # Random init is small; widen o_proj so an ablated head visibly moves the logits.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() == 2 else 1.0)
    return model


def save(model, folder: Path, max_shard_size: str | None = None) -> Path:
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return folder


def tree_digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


INPUT = torch.tensor([[1, 5, 9, 13, 2, 7, 40, 3], [4, 4, 8, 15, 16, 23, 42, 11]])


def logits(model, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT, **kw).logits


# ---- geometry ------------------------------------------------------------------------------
def test_layout_reads_head_dim_and_gqa_from_config():
    model = make_model("qwen3-headdim")
    layout = HeadLayout.from_model(model)
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads, layout.head_dim) == (3, 4, 2, 12)
    assert layout.o_proj_in_features == 48 != model.config.hidden_size
    assert layout.columns(2) == slice(24, 36)
    assert layout.o_proj_path(1) == "model.layers.1.self_attn.o_proj"


def test_real_configs_give_real_layouts():
    data = os.environ.get("HEADEDIT_DATA_DIR")
    tokenizers = Path(data).parent / "tokenizers" if data else None
    if not tokenizers or not tokenizers.is_dir():
        pytest.skip("HEADEDIT_DATA_DIR not set")
    smol = HeadLayout.from_config(json.loads((tokenizers / "SmolLM3-3B" / "config.json").read_text()))
    assert (smol.num_layers, smol.num_heads, smol.num_kv_heads, smol.head_dim) == (36, 16, 4, 128)


def test_unsupported_architecture_is_named():
    with pytest.raises(UnsupportedModelError, match="MambaForCausalLM.*no layer has softmax attention heads"):
        HeadLayout.from_config({"model_type": "mamba", "architectures": ["MambaForCausalLM"], "num_hidden_layers": 2,
                                "hidden_size": 16, "vocab_size": 64, "state_size": 4})
    with pytest.raises(UnsupportedModelError, match="does not know this model type"):
        HeadLayout.from_config({"model_type": "no-such-decoder", "num_hidden_layers": 2})


def test_absurd_config_rejected_before_allocation():
    with pytest.raises(UnsupportedModelError, match="num_attention_heads=1000000000"):
        HeadLayout.from_config({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 10**9,
                                "hidden_size": 64})


# ---- head-set text ------------------------------------------------------------------------
def test_head_text_round_trip_and_forms():
    layout = HeadLayout.from_model(make_model("llama"))
    assert parse_heads("2.1, 0.3,2.1") == (Head(0, 3), Head(2, 1))
    assert format_heads(parse_heads("1.*", layout)) == "1.0,1.1,1.2,1.3"
    assert format_heads(parse_heads("2.0-2,0.1", layout)) == "0.1,2.0,2.1,2.2"
    assert parse_heads("") == ()
    text = "0.1,1.3,2.2"
    assert format_heads(parse_heads(text)) == text


@pytest.mark.parametrize("bad", ["3", "a.b", "1.2.3", "1.", "1.3-1", "1.2,,3.4", "-1.2", "1.*x"])
def test_malformed_head_text(bad):
    with pytest.raises(HeadSpecError):
        parse_heads(bad)


def test_head_outside_model_names_range():
    layout = HeadLayout.from_model(make_model("llama"))
    with pytest.raises(HeadSpecError, match=r"layer 7 not in 0\.\.2"):
        parse_heads("7.0", layout)
    with pytest.raises(HeadSpecError, match=r"head 4 not in 0\.\.3"):
        parse_heads("1.4", layout)


# ---- the key invariant: hook ablation == baked reloaded checkpoint -----------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_hook_ablation_equals_baked_checkpoint(arch, tmp_path):
    model = make_model(arch)
    src = save(model, tmp_path / "src")
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


def test_per_row_mask_equals_one_set_at_a_time():
    model = make_model("llama-gqa")
    layout = HeadLayout.from_model(model)
    sets = [(), parse_heads("0.1"), parse_heads("1.0,2.3"), parse_heads("0.0,0.1,0.2,0.3")]
    ids = INPUT[:1].repeat(len(sets), 1)  # [set, pos]
    mask = heads_to_mask(layout, sets)  # [set, layer, head]
    with ablate(model, layout, mask=mask), torch.no_grad():
        packed = model(input_ids=ids).logits
    for row, heads in enumerate(sets):
        with ablate(model, layout, heads=heads), torch.no_grad():
            single = model(input_ids=INPUT[:1]).logits
        assert torch.equal(packed[row], single[0]), row


def test_hooks_removed_even_on_error():
    model = make_model("llama")
    before = logits(model)
    with pytest.raises(RuntimeError):
        with ablate(model, heads=parse_heads("0.0")):
            raise RuntimeError("boom")
    assert torch.equal(logits(model), before)
    assert all(not m._forward_pre_hooks for m in model.modules())


# ---- bake file guarantees ------------------------------------------------------------------
def test_bake_changes_only_named_columns_and_keeps_sharding(tmp_path):
    model = make_model("llama")
    src = save(model, tmp_path / "src", max_shard_size="20KB")
    assert (src / "model.safetensors.index.json").is_file()
    before = tree_digest(src)
    out = bake(src, "1.2,2.0", tmp_path / "out")
    assert tree_digest(src) == before  # source untouched
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in out.glob("*.safetensors")}
    layout = HeadLayout.from_model(model)
    changed = 0
    for shard in sorted(src.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as a, safe_open(str(out / shard.name), "pt") as b:
            assert set(a.keys()) == set(b.keys())
            for key in a.keys():
                x, y = a.get_tensor(key), b.get_tensor(key)
                if key in (layout.o_proj_weight_key(1), layout.o_proj_weight_key(2)):
                    head = 2 if key == layout.o_proj_weight_key(1) else 0
                    cols = layout.columns(head)
                    assert torch.count_nonzero(y[:, cols]) == 0
                    keep = torch.ones(x.shape[1], dtype=torch.bool)
                    keep[cols] = False
                    assert torch.equal(x[:, keep].view(torch.int32), y[:, keep].view(torch.int32))
                    changed += 1
                else:
                    assert torch.equal(x.view(torch.uint8) if x.dtype == torch.bool else x, y), key
    assert changed == 2
    manifest = verify_export(out)
    assert manifest["heads"] == "1.2,2.0"
    assert set(manifest["source"]["files"]) == {p.name for p in src.glob("*.safetensors")}


def test_bake_refuses_existing_output_and_leaves_no_temp(tmp_path):
    src = save(make_model("llama"), tmp_path / "src")
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
    src = save(make_model("llama"), tmp_path / "src")
    with pytest.raises(OutputExistsError, match="overlaps the source"):
        bake(src, "0.1", src / "edited", force=True)


def test_verify_export_detects_tampering(tmp_path):
    src = save(make_model("llama"), tmp_path / "src")
    out = bake(src, "0.1", tmp_path / "out")
    with open(out / "config.json", "a") as fh:
        fh.write(" ")
    with pytest.raises(ExportError, match="config.json no longer matches"):
        verify_export(out)


def test_rebake_keeps_earlier_heads(tmp_path):
    src = save(make_model("llama"), tmp_path / "src")
    first = bake(src, "0.1", tmp_path / "a")
    second = bake(first, "2.3", tmp_path / "b")
    assert json.loads((second / "headedit.json").read_text())["heads"] == "0.1,2.3"


# ---- CLI -----------------------------------------------------------------------------------
def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "headedit", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


@pytest.fixture(scope="module")
def cli_src(tmp_path_factory):
    return save(make_model("llama"), tmp_path_factory.mktemp("cli") / "src")


def test_cli_bake_and_inspect(cli_src, tmp_path):
    res = cli("bake", str(cli_src), "--heads", "1.*", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    res = cli("inspect", str(tmp_path / "out"), "--json")
    info = json.loads(res.stdout)
    assert (info["num_layers"], info["num_heads"], info["head_dim"]) == (3, 4, 8)
    assert info["ablated_heads"] == "1.0,1.1,1.2,1.3"
    assert info["parameters"] == sum(p.numel() for p in make_model("llama").parameters())


@pytest.mark.parametrize("args, needle", [
    (["bake", "{src}", "--heads", "9.0", "--out", "{tmp}/o"], "outside the model"),
    (["bake", "{src}", "--heads", "1.x", "--out", "{tmp}/o"], "malformed head"),
    (["bake", "{tmp}/missing", "--heads", "0.1", "--out", "{tmp}/o"], "not found"),
    (["bake", "{src}", "--heads", "0.1", "--out", "{tmp}/exists"], "already exists"),
    (["inspect", "{tmp}/mamba"], "unsupported architecture MambaForCausalLM"),
    (["inspect", "no-such-org/no-such-model"], "could not be fetched"),
    (["bake", "{src}"], "required"),
])
def test_cli_bad_input_one_line_exit_2(cli_src, tmp_path, args, needle):
    (tmp_path / "exists").mkdir()
    (tmp_path / "mamba").mkdir()  # no attention heads at all: refused before any weight file is looked for
    (tmp_path / "mamba" / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"],
                                                                "num_hidden_layers": 2, "hidden_size": 16}))
    res = cli(*[a.format(src=cli_src, tmp=tmp_path) for a in args])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()


def test_import_headedit_does_not_import_textual():
    code = "import headedit, headedit.cli, headedit.export.bake, sys; assert 'textual' not in sys.modules, 'textual imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_cli_reports_bad_input_without_loading_torch():
    """A mistyped path must answer at once: argument parsing and recipe checks never import torch."""
    code = ("import sys; from headedit.cli import main; rc = main(['discover', '/no/such/recipe.toml']); "
            "assert rc == 2, rc; assert 'torch' not in sys.modules, 'torch imported'; "
            "from headedit import ablate; assert 'torch' in sys.modules")  # the lazy export still works
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "recipe" in res.stderr and "not found" in res.stderr
