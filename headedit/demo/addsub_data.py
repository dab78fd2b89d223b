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

import importlib.resources
import random
from pathlib import Path
from typing import Literal

from ..errors import ModelNotFoundError, TaskError
from ..heads import Head
from ..tasks import register_task
from ..tasks.base import Example, Split, SplitName, Task
from .data import (
    BOS, EOS, N_DISCOVERY, N_HELDOUT, N_TRAIN, PAD, SPECIALS, SPLIT_SEED, UNK, VOCAB, index_pair, split_pairs,
)

ADDSUB_VOCAB: tuple[str, ...] = VOCAB + ("-",)  # 44 tokens: the copy demo's 43, then '-'
AddSubTask = Literal["add-demo", "sub-demo"]
TASK_LETTER = {"add-demo": "A", "sub-demo": "S"}  # the prompt prefix that says which operation is asked
TASK_SIGN = {"add-demo": "+", "sub-demo": "-"}
MODEL_DIR = "addsub_model"

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
    """One token per character over `ADDSUB_VOCAB`; `<bos>` written as text is one token, no BOS is added."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={tok: i for i, tok in enumerate(ADDSUB_VOCAB)}, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left", model_max_length=32, clean_up_tokenization_spaces=False,
    )


def prompt_text(task: AddSubTask, a: int, b: int) -> str:
    """`<bos>A aa+bb=` or `<bos>S aa-bb=`: nine tokens, the BOS token part of the text."""
    return f"{BOS}{TASK_LETTER[task]} {a:02d}{TASK_SIGN[task]}{b:02d}="


def target_text(task: AddSubTask, a: int, b: int) -> str:
    """Three characters either way, so both tasks train on sequences of the same length."""
    if task == "add-demo":
        return f"{a + b:03d}"
    return f"{'0' if a >= b else '-'}{abs(a - b):02d}"


def addsub_model_path() -> Path:
    """The committed add/sub checkpoint folder, found through package resources (like `demo_model_path`)."""
    path: Path | None = None
    try:
        candidate = importlib.resources.files("headedit.demo") / MODEL_DIR
        if isinstance(candidate, Path):
            path = candidate
    except (ModuleNotFoundError, TypeError):
        path = None
    if path is None or not (path / "config.json").is_file():
        path = Path(__file__).parent / MODEL_DIR
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ModelNotFoundError(
            f"the bundled add/sub demo model is missing from {path}",
            "reinstall headedit, or retrain it with `python -m headedit.demo.addsub OUT`",
        )
    return path


class AddSubDemoTask(Task):
    """Two-digit addition or subtraction; exact match of the three answer characters and `<eos>`."""

    kind = "exact"
    metric = "acc"
    dataset_id = None
    default_sizes = (N_DISCOVERY, N_HELDOUT)
    max_new_tokens = 4  # three characters and <eos>

    def __init__(self, name: AddSubTask) -> None:
        self.name = name

    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        """The pairs of `split`; a smaller `size` takes a seeded subset (same seed: nested subsets)."""
        if split not in ("discovery", "heldout"):
            raise TaskError(f"{self.name} has no split {split!r}", "use 'discovery' or 'heldout'")
        order = split_pairs(split)
        if size is not None and not 1 <= size <= len(order):
            raise TaskError(f"{self.name} {split} has {len(order)} pairs, {size} requested",
                            f"ask for at most {len(order)}")
        chosen = order
        if size is not None and size < len(order):
            shuffled = list(order)
            random.Random(seed).shuffle(shuffled)
            chosen = shuffled[:size]
        examples = []
        for index in chosen:
            a, b = index_pair(index)
            examples.append(Example(index=index, prompt=prompt_text(self.name, a, b),
                                    target=target_text(self.name, a, b), meta={"stop_token": EOS, "a": a, "b": b}))
        source = (f"headedit add/sub demo pairs: {len(examples)} of the {len(order)} {split} pairs "
                  f"(split seed {SPLIT_SEED}, disjoint from the {N_TRAIN} training pairs)")
        return Split(task=self.name, name=split, examples=examples, source=source)


ADD_DEMO = register_task(AddSubDemoTask("add-demo"))
SUB_DEMO = register_task(AddSubDemoTask("sub-demo"))
