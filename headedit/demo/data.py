"""The demo's vocabulary, tokenizer and pair splits: shared by training and the registered tasks.

The split is fixed by `SPLIT_SEED` (not by the training seed or a task's load seed), so the
discovery and held-out pairs the tasks serve are always disjoint from the pairs the model trained on.
"""
from __future__ import annotations

import random
import string
from typing import Literal, Sequence

SPLIT_SEED = 0
N_TRAIN, N_DISCOVERY, N_HELDOUT = 7000, 1000, 2000  # together all 100 x 100 pairs
NUM_PAIRS = 10_000

BOS, EOS, PAD, UNK = "<bos>", "<eos>", "<pad>", "<unk>"
SPECIALS = (PAD, UNK, BOS, EOS)
# 4 specials + 10 digits + space, '+', '=' + 26 letters = 43 tokens, one character each.
VOCAB: tuple[str, ...] = SPECIALS + tuple(string.digits) + (" ", "+", "=") + tuple(string.ascii_uppercase)

TaskName = Literal["copy-first", "copy-second"]
TASK_LETTER = "A"  # both copy tasks share the prompt exactly: no cue says which one is asked
FIRST_SHARE = 0.6  # training mixture: 60% copy-first, 40% copy-second
PairSplit = Literal["train", "discovery", "heldout"]


def build_tokenizer(vocab: Sequence[str] = VOCAB):
    """A WordLevel tokenizer over single characters of `vocab`, wrapped for transformers.

    Special tokens written as text (`<bos>`) are matched whole; everything else is one token per
    character. It adds no BOS itself: prompts carry `<bos>` explicitly, so `add_special_tokens`
    True or False gives the same ids.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ids = {tok: i for i, tok in enumerate(vocab)}
    core = Tokenizer(models.WordLevel(vocab=ids, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=32,
        clean_up_tokenization_spaces=False,
    )


def pair_index(a: int, b: int) -> int:
    return 100 * a + b


def index_pair(index: int) -> tuple[int, int]:
    return divmod(index, 100)


def split_pairs(split: PairSplit) -> list[int]:
    """Pair indices (100*a + b) of one split, in a fixed seeded order; the three splits are disjoint."""
    order = list(range(NUM_PAIRS))
    random.Random(SPLIT_SEED).shuffle(order)
    bounds = {"train": (0, N_TRAIN), "discovery": (N_TRAIN, N_TRAIN + N_DISCOVERY),
              "heldout": (N_TRAIN + N_DISCOVERY, NUM_PAIRS)}
    lo, hi = bounds[split]
    return order[lo:hi]


def prompt_text(a: int, b: int, letter: str = TASK_LETTER) -> str:
    """`<bos>A aa+bb=`: the BOS token is part of the text."""
    return f"{BOS}{letter} {a:02d}+{b:02d}="


def copy_target(task: TaskName, a: int, b: int) -> str:
    """`0aa` for copy-first, `0bb` for copy-second (three digits, like a sum would have)."""
    return f"0{a:02d}" if task == "copy-first" else f"0{b:02d}"
