"""BoolQ: lm-eval prompt, no/yes choices, train-or-carve splits (local files and the real copy)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from headedit.errors import TaskError
from headedit.tasks import get_task

REAL = os.environ.get("HEADEDIT_DATA_DIR")


def _write(folder: Path, split: str, n: int, offset: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"question": f"is row {i + offset} true", "answer": i % 3 == 0, "passage": f"Passage {i + offset}."} for i in range(n)]
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_prompt_and_choices(tmp_path):
    _write(tmp_path / "boolq", "validation", 20)
    ex = get_task("boolq").load("heldout", 3, data_dir=tmp_path).examples[0]
    assert ex.prompt == f"Passage {ex.index}.\nQuestion: is row {ex.index} true?\nAnswer:"
    assert ex.choices == (" no", " yes") and ex.label == int(ex.index % 3 == 0)


def test_carves_validation_without_overlap_when_train_missing(tmp_path):
    _write(tmp_path / "boolq", "validation", 40)
    task = get_task("boolq")
    disc, held = task.load("discovery", None, 0, tmp_path), task.load("heldout", None, 0, tmp_path)
    assert len(disc) == 20 and len(held) == 20 and "carved" in disc.note and "carved" in held.note
    assert not {e.index for e in disc.examples} & {e.index for e in held.examples}
    small = [e.index for e in task.load("discovery", 5, 0, tmp_path).examples]
    assert small == sorted(small) and set(small) <= {e.index for e in disc.examples}  # a seeded subset, in row order
    assert small == [e.index for e in task.load("discovery", 5, 0, tmp_path).examples]
    with pytest.raises(TaskError, match="carved"):
        task.load("heldout", 25, 0, tmp_path)


def test_discovery_from_train_when_present(tmp_path):
    _write(tmp_path / "boolq", "validation", 10)
    _write(tmp_path / "boolq", "train", 30, offset=1000)
    task = get_task("boolq")
    disc = task.load("discovery", 8, 0, tmp_path)
    assert disc.note == "" and "train" in disc.source and all("row 10" in e.prompt for e in disc.examples)
    assert len(task.load("heldout", None, 0, tmp_path)) == 10


@pytest.mark.realdata
@pytest.mark.skipif(not REAL, reason="needs HEADEDIT_DATA_DIR")
def test_real_boolq_rows():
    task = get_task("boolq")
    disc, held = task.load("discovery", None, 0, None), task.load("heldout", None, 0, None)
    assert len(disc) + len(held) == 3270 and "carved" in held.note
    assert not {e.index for e in disc.examples} & {e.index for e in held.examples}
    ex = held.examples[0]
    assert ex.prompt.endswith("?\nAnswer:") and "\nQuestion: " in ex.prompt and ex.choices == (" no", " yes")
