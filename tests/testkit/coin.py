"""The `coin-test` task: " yes" or " no" about random word strings, labels drawn by coin flip.

A random-weight tiny model scores near 50% and ablating heads moves its answers (real forwards, real variation,
no data files), while no head can matter for the labels: the null case of discovery. Importing this module
registers the task; subprocesses import it through `CLI_CODE`.
"""
from __future__ import annotations

import random
from pathlib import Path

from headedit.tasks import Example, Split, Task, register_task

TESTS = Path(__file__).resolve().parents[1]
WORDS = ("the", "is", "of", "and", "to", "in", "a", "that", "it", "was", "for", "on", "with", "he", "she",
         "they", "are", "be", "this", "not", "can", "will", "plus", "minus", "times")
# `python -c CLI_CODE ARGS...`: the headedit CLI with coin-test registered (the task lives in tests/, not the package).
CLI_CODE = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import testkit.coin; "
            "from headedit.cli import main; sys.exit(main())")


class CoinTask(Task):
    name = "coin-test"
    kind = "choice"
    metric = "acc"
    dataset_id = None
    default_sizes = (256, 128)

    def load(self, split, size=None, seed=0, data_dir=None) -> Split:
        n = self.default_sizes[0 if split == "discovery" else 1] if size is None else int(size)
        rng = random.Random(f"{split}:{seed}")
        examples = []
        for i in range(n):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
            examples.append(Example(i, f"Question: {words}?\nAnswer:", choices=(" no", " yes"), label=rng.randint(0, 1)))
        return Split(self.name, split, examples, f"coin-test {split} seed {seed}")


register_task(CoinTask())
