"""HellaSwag: lm-eval preprocessing, four endings, acc_norm lengths; the real copy's size."""
from __future__ import annotations

import json
import os

import pytest

from headedit.tasks import get_task
from headedit.tasks.hellaswag import preprocess

REAL = os.environ.get("HEADEDIT_DATA_DIR")


def test_preprocess_like_lm_eval():
    assert preprocess(" Making a cake: [header] How to bake [title] Mix it.  Then ") == "Making a cake: How to bake. Mix it. Then"


def test_query_and_endings(tmp_path):
    row = {"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
           "endings": ["is using wrap.", "starts pulling up roofing [step] now."], "label": "1"}
    (tmp_path / "hellaswag").mkdir()
    (tmp_path / "hellaswag" / "validation.jsonl").write_text(json.dumps(row) + "\n")
    (ex,) = get_task("hellaswag").load("heldout", 1, 0, tmp_path).examples
    assert ex.prompt == "Roof shingle removal: A man is sitting on a roof. He"
    assert ex.choices == (" is using wrap.", " starts pulling up roofing now.") and ex.label == 1
    assert ex.meta["choice_lengths"] == (14, 30)
    assert get_task("hellaswag").metric == "acc_norm"


@pytest.mark.realdata
@pytest.mark.skipif(not REAL, reason="needs HEADEDIT_DATA_DIR")
def test_real_hellaswag_rows():
    task = get_task("hellaswag")
    held = task.load("heldout", None, 0, None)
    disc = task.load("discovery", None, 0, None)
    assert len(disc) == 2000 and len(held) == 8042 and "carved" in held.note
    ex = held.examples[0]
    assert len(ex.choices) == 4 and all(c.startswith(" ") for c in ex.choices) and 0 <= ex.label < 4
    assert ": " in ex.prompt and "[" not in ex.prompt
