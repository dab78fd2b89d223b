"""Head geometry read from configs and the head-set text: forms, round trips, malformed and out-of-range sets."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from testkit.models import family_model

from headedit import Head, HeadLayout, format_heads, parse_heads
from headedit.errors import HeadSpecError, UnsupportedModelError


def test_layout_reads_head_dim_and_gqa_from_config():
    model = family_model("qwen3-headdim")
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
    layout = HeadLayout.from_model(family_model("llama"))
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
    layout = HeadLayout.from_model(family_model("llama"))
    with pytest.raises(HeadSpecError, match=r"layer 7 not in 0\.\.2"):
        parse_heads("7.0", layout)
    with pytest.raises(HeadSpecError, match=r"head 4 not in 0\.\.3"):
        parse_heads("1.4", layout)


