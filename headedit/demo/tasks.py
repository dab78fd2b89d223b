"""The demo's tasks, `copy-first` and `copy-second`, registered like any other task.

Both serve the same pairs with the same prompt `<bos>A aa+bb=`; only the target differs (`0aa` vs `0bb`).
The discovery (1,000) and held-out (2,000) pairs are the ones training never saw (`data.split_pairs`).

Tokenisation contract: the prompt text starts with the literal `<bos>` token text, because the engine
tokenises `prompt` and `prompt + target` with `add_special_tokens=False` for exact tasks (and the demo
tokenizer adds no BOS itself, so both settings give the same ids). The model was trained to end every
answer with `<eos>`, so `meta["stop_token"] = "<eos>"`: an example is correct when every target token
and then the stop token are the greedy argmax.
"""
from __future__ import annotations

import random
from pathlib import Path

from headedit.demo.data import (
    EOS,
    N_DISCOVERY,
    N_HELDOUT,
    N_TRAIN,
    SPLIT_SEED,
    TaskName,
    copy_target,
    index_pair,
    prompt_text,
    split_pairs,
)
from headedit.errors import TaskError
from headedit.model.bundled import DEMO_ID, bundled_model_path
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.registry import register_task


def demo_model_path() -> Path:
    """The committed demo checkpoint folder (config, tokenizer, model.safetensors)."""
    return bundled_model_path(DEMO_ID)


class PairTask(Task):
    """An exact-match task over the demo's `aa`/`bb` pair splits: a three-character answer, then `<eos>`.

    Subclasses say how a pair becomes text (`texts`); splits, seeded subsets and sizes are shared.
    """

    kind = "exact"
    metric = "acc"
    dataset_id = None
    default_sizes = (N_DISCOVERY, N_HELDOUT)
    max_new_tokens = 4  # three characters and <eos>
    source_label = "headedit demo pairs aa+bb"

    def __init__(self, name: str) -> None:
        self.name = name

    def texts(self, a: int, b: int) -> tuple[str, str]:
        """(prompt, target) of the pair (a, b)."""
        raise NotImplementedError

    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        """The pairs of `split`; a smaller `size` takes a seeded subset (same seed: nested subsets)."""
        if split not in ("discovery", "heldout"):
            raise TaskError(f"{self.name} has no split {split!r}", "use 'discovery' or 'heldout'")
        order = split_pairs(split)
        if size is not None and not 1 <= size <= len(order):
            raise TaskError(
                f"{self.name} {split} has {len(order)} pairs, {size} requested",
                f"ask for at most {len(order)} (the demo has {N_DISCOVERY} discovery and {N_HELDOUT} held-out pairs)",
            )
        chosen = order
        if size is not None and size < len(order):
            shuffled = list(order)
            random.Random(seed).shuffle(shuffled)
            chosen = shuffled[:size]
        examples = []
        for index in chosen:
            a, b = index_pair(index)
            prompt, target = self.texts(a, b)
            examples.append(Example(index=index, prompt=prompt, target=target, meta={"stop_token": EOS, "a": a, "b": b}))
        source = (
            f"{self.source_label}: {len(examples)} of the {len(order)} {split} pairs "
            f"(split seed {SPLIT_SEED}, disjoint from the {N_TRAIN} training pairs)"
        )
        return Split(task=self.name, name=split, examples=examples, source=source)


class CopyTask(PairTask):
    """Copy one of the two numbers of `aa+bb` as a three-digit answer `0xx`."""

    def __init__(self, name: TaskName) -> None:
        super().__init__(name)

    def texts(self, a: int, b: int) -> tuple[str, str]:
        return prompt_text(a, b), copy_target(self.name, a, b)  # type: ignore[arg-type]


COPY_FIRST = register_task(CopyTask("copy-first"))
COPY_SECOND = register_task(CopyTask("copy-second"))
