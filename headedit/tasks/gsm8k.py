"""GSM8K: 5-shot grade-school maths, exact match of the `#### N` answer (lm-eval's strict-match).

Follows lm-evaluation-harness `lm_eval/tasks/gsm8k/gsm8k.yaml` (version 3.0, read via the code index):
doc_to_text `Question: {{question}}\\nAnswer:`, few-shot target `{{answer}}` after target_delimiter " ",
shots joined by fewshot_delimiter "\\n\\n", num_fewshot 5 drawn from train by lm-eval's default sampler,
greedy until `Question:`, `</s>`, `<|im_end|>`; filter `strict-match`: first match of
`#### (\\-?[0-9\\.\\,]+)` (else "[invalid]"); metric exact_match with regexes_to_ignore `,`, `\\$`,
`(?s).*#### `, `\\.$` and ignore_case, applied to prediction and reference alike.

Shots: lm-eval seeds `random.Random(1234)` and draws `rnd.sample(train, 5)` once per evaluated document,
in order (drawing 6 and dropping the document itself when the shots come from the evaluated split). We draw
the same way indexed by the row's position in its source split, so a row's prompt does not depend on which
other rows were picked; on the full test split this is the draw sequence lm-eval uses.
"""
from __future__ import annotations

import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.data import carve, load_rows
from headedit.tasks.registry import register_task

QUESTION = "Question: {question}\nAnswer:"
TARGET_DELIMITER = " "
FEWSHOT_DELIMITER = "\n\n"
NUM_FEWSHOT = 5
FEWSHOT_SEED = 1234
STRICT_MATCH = re.compile(r"#### (\-?[0-9\.\,]+)")
IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))
INVALID = "[invalid]"


def extract_answer(text: str) -> str:
    """lm-eval strict-match: the first `#### N` number, or "[invalid]"."""
    match = STRICT_MATCH.search(text)
    return match.group(1) if match else INVALID


def normalize(text: str) -> str:
    """lm-eval exact_match preprocessing: drop `,`, `$`, everything up to `#### `, one trailing `.`; lowercase."""
    for pattern in IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def reference_answer(answer_field: str) -> str:
    return normalize(answer_field)


def is_correct(generated: str, answer_field: str, stops: Sequence[str] = ()) -> bool:
    for stop in stops:  # lm-eval's HF backend cuts at each stop sequence in turn
        if stop:
            generated = generated.split(stop)[0]
    return normalize(extract_answer(generated)) == reference_answer(answer_field)


@lru_cache(maxsize=8)
def _shot_draws(n_train: int, n_docs: int, same_split: bool) -> tuple[tuple[int, ...], ...]:
    """Train-row indices drawn for documents 0..n_docs-1, as lm-eval's default sampler draws them."""
    rnd = random.Random(FEWSHOT_SEED)
    k = NUM_FEWSHOT + 1 if same_split else NUM_FEWSHOT
    population = range(n_train)
    return tuple(tuple(rnd.sample(population, k)) for _ in range(n_docs))


def shot_indices(row: int, n_train: int, n_docs: int, same_split: bool) -> list[int]:
    drawn = _shot_draws(n_train, n_docs, same_split)[row]
    return [i for i in drawn if not (same_split and i == row)][:NUM_FEWSHOT]


def build_prompt(question: str, shots: Sequence[dict[str, Any]]) -> str:
    context = "".join(QUESTION.format(question=s["question"]) + TARGET_DELIMITER + s["answer"] + FEWSHOT_DELIMITER
                      for s in shots)
    return context + QUESTION.format(question=question)


class GSM8KTask(Task):
    name = "gsm8k"
    kind = "generate"
    metric = "exact_match"
    dataset_id = "openai/gsm8k"
    config = "main"
    folder = "gsm8k"
    default_sizes = (1000, 1319)  # discovery carved from train; held-out = all of test
    max_new_tokens = 256  # lm-eval's default max_gen_toks
    stop = ("Question:", "</s>", "<|im_end|>")
    source_splits: dict[str, str] = {"discovery": "train", "heldout": "test"}

    def load(self, split: SplitName, size: int | None = None, seed: int = 0,
             data_dir: Path | str | None = None) -> Split:
        if split not in self.source_splits:
            raise TaskError(f"unknown split {split!r}", "use discovery or heldout")
        source = self.source_splits[split]
        train, where_train = load_rows(self.dataset_id, "train", self.folder, data_dir, self.config)
        if source == "train":
            rows, where = train, where_train
        else:
            rows, where = load_rows(self.dataset_id, source, self.folder, data_dir, self.config)
        want = self.default_sizes[0 if split == "discovery" else 1] if size is None else size
        if not 0 < want <= len(rows):
            raise TaskError(f"requested {want} {split} examples but GSM8K {source} has {len(rows)} rows",
                            f"ask for 1..{len(rows)} examples")
        if want == len(rows):
            picked, which = list(range(len(rows))), f"all {len(rows)} rows"
        else:
            picked, which = carve(rows, (want, 0), seed, 0), f"{want} of {len(rows)} rows (seed {seed})"
        same = source == "train"
        examples = []
        for i in picked:
            row = rows[i]
            shots = [train[j] for j in shot_indices(i, len(train), len(rows), same)]
            examples.append(Example(index=i, prompt=build_prompt(row["question"], shots),
                                    meta={"reference": reference_answer(row["answer"]), "answer": row["answer"]}))
        return Split(task=self.name, name=split, examples=examples, source=f"{where}: {which}")

    def check(self, example: Example, generated: str) -> bool:
        return is_correct(generated, example.meta["answer"], self.stop)

    def check_many(self, examples: Sequence[Example], generations: Sequence[str], workers: int | None = None) -> list[bool]:
        if len(examples) != len(generations):
            raise ValueError("examples and generations differ in length")
        return [self.check(ex, gen) for ex, gen in zip(examples, generations)]


TASK = register_task(GSM8KTask())
