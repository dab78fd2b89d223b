"""The add/sub demo's vocabulary, tokenizer, formats and tasks (`add-demo`, `sub-demo`); no torch needed.

Why a second vocabulary: subtraction needs `-`, which the copy demo's 43 tokens lack, so this one appends it
(44 tokens; every copy-demo token keeps its id). The pair splits are the copy demo's (`data.split_pairs`,
fixed by `data.SPLIT_SEED`), so discovery and held-out pairs are never trained on.

| task | prompt | target |
|---|---|---|
| `add-demo` | `<bos>A aa+bb=` | `sss` (the sum, three digits) |
| `sub-demo` | `<bos>S aa-bb=` | `0dd` if aa >= bb, else `-dd` (sign, then |aa - bb| in two digits) |

Importing this module registers both tasks; `addsub_model_path()` is the committed checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from headedit.demo import data
from headedit.demo.data import BOS, VOCAB
from headedit.demo.tasks import PairTask
from headedit.model.bundled import ADDSUB_ID, bundled_model_path
from headedit.model.heads import Head
from headedit.tasks.registry import register_task

ADDSUB_VOCAB: tuple[str, ...] = VOCAB + ("-",)  # 44 tokens: the copy demo's 43, then '-'
AddSubTask = Literal["add-demo", "sub-demo"]
TASK_LETTER = {"add-demo": "A", "sub-demo": "S"}  # the prompt prefix that says which operation is asked
TASK_SIGN = {"add-demo": "+", "sub-demo": "-"}

# The ground truth the training script plants (see `addsub.PLANTING`): on subtraction rows these heads are zeroed
# (most of the time) and their q/k/v never learn from subtraction, so they carry addition features that disturb
# subtraction at inference.
PLANTED_SINGLE: tuple[Head, ...] = (Head(1, 2),)  # harmful alone
PAIR_VISIBLE, PAIR_HIDDEN = Head(0, 1), Head(1, 0)  # zeroing the hidden half alone looks harmless (or worse)
PLANTED_PAIR: tuple[Head, ...] = (PAIR_VISIBLE, PAIR_HIDDEN)
PLANTED: tuple[Head, ...] = tuple(sorted(PLANTED_SINGLE + PLANTED_PAIR))
# Zeroed on every training row: it stands in for the many near-silent heads of a real model, scores about 0
# alone and so outranks the pair's hidden half in the screen's candidate list.
IDLE_HEADS: tuple[Head, ...] = (Head(0, 3),)


def build_tokenizer():
    """One token per character over `ADDSUB_VOCAB` (the copy demo's tokenizer with `-` added)."""
    return data.build_tokenizer(ADDSUB_VOCAB)


def prompt_text(task: AddSubTask, a: int, b: int) -> str:
    """`<bos>A aa+bb=` or `<bos>S aa-bb=`: nine tokens, the BOS token part of the text."""
    return f"{BOS}{TASK_LETTER[task]} {a:02d}{TASK_SIGN[task]}{b:02d}="


def target_text(task: AddSubTask, a: int, b: int) -> str:
    """Three characters either way, so both tasks train on sequences of the same length."""
    if task == "add-demo":
        return f"{a + b:03d}"
    return f"{'0' if a >= b else '-'}{abs(a - b):02d}"


def addsub_model_path() -> Path:
    """The committed add/sub checkpoint folder."""
    return bundled_model_path(ADDSUB_ID)


class AddSubDemoTask(PairTask):
    """Two-digit addition or subtraction; exact match of the three answer characters and `<eos>`."""

    source_label = "headedit add/sub demo pairs"

    def __init__(self, name: AddSubTask) -> None:
        super().__init__(name)

    def texts(self, a: int, b: int) -> tuple[str, str]:
        return prompt_text(self.name, a, b), target_text(self.name, a, b)  # type: ignore[arg-type]


ADD_DEMO = register_task(AddSubDemoTask("add-demo"))
SUB_DEMO = register_task(AddSubDemoTask("sub-demo"))
