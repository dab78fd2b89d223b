"""HellaSwag (Rowan/hellaswag) with lm-eval's preprocessing and acc_norm.

Query `preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())`, four preprocessed endings after
a space; acc_norm divides each ending's log-likelihood by its length (lm-eval: `len(choice)`, the ending
without the leading space; kept in `meta["choice_lengths"]` as UTF-8 bytes). The local copy has `ctx_b`
empty and the whole context in `ctx_a`, with markup already stripped, so its queries keep the lower-case
start of the second context part that lm-eval would capitalize.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.boolq import train_or_carve
from headedit.tasks.registry import register_task


def preprocess(text: str) -> str:
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


class HellaSwagTask(Task):
    name = "hellaswag"
    kind = "choice"
    metric = "acc_norm"
    dataset_id = "Rowan/hellaswag"
    default_sizes = (2000, 10042)
    length_normalize = True

    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        rows, idx, source, note = train_or_carve(self, "hellaswag", split, size, seed, data_dir)
        return Split(self.name, split, [self.example(i, rows[i]) for i in idx], source, note)

    @staticmethod
    def example(index: int, row: dict[str, Any]) -> Example:
        try:
            ctx = row["ctx_a"] + " " + str(row.get("ctx_b") or "").capitalize()
            query = preprocess(row["activity_label"] + ": " + ctx)
            endings = [preprocess(e) for e in row["endings"]]
            label = int(row["label"])
        except (KeyError, ValueError, TypeError) as err:
            raise TaskError(f"hellaswag row {index} is malformed ({err})", "rows need activity_label, ctx_a, ctx_b, endings, label") from None
        return Example(
            index, query, choices=tuple(" " + e for e in endings), label=label,
            meta={"choice_lengths": tuple(len(e.encode("utf-8")) for e in endings)},
        )


register_task(HellaSwagTask())
