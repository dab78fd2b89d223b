"""Arithmetic: the ten lm-eval (GPT-3) arithmetic families, generated deterministically.

Prompts follow lm-eval's `EleutherAI/arithmetic` rows (GPT-3's files with `Q:`/`A:` rewritten):
`Question: What is 12 plus 34?\\nAnswer:` -> ` 46`; `minus`, `times`, and `(a + b) * c` for the one-digit
composite family. Correct when the target is the greedy continuation (lm-eval's `acc` = `is_greedy`).
Examples cycle through the families; which split a prompt belongs to is fixed by a hash of its text, so
discovery and held-out never overlap and neither depends on the other's size.
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.registry import register_task

FAMILIES = ("2da", "3da", "4da", "5da", "2ds", "3ds", "4ds", "5ds", "2dm", "1dc")
_WORD = {"a": "plus", "s": "minus", "m": "times"}
MAX_SIZE = 200_000


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def make_problem(family: str, rng: random.Random) -> tuple[str, int]:
    """(question text, answer) of one problem of `family`."""
    if family == "1dc":
        a, b, c = (rng.randint(0, 9) for _ in range(3))
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        inner = {"+": a + b, "-": a - b, "*": a * b}[op1]
        answer = {"+": inner + c, "-": inner - c, "*": inner * c}[op2]
        return f"What is ({a} {op1} {b}) {op2} {c}?", answer
    digits, op = int(family[0]), family[2]
    a, b = _operand(rng, digits), _operand(rng, digits)
    answer = {"a": a + b, "s": a - b, "m": a * b}[op]
    return f"What is {a} {_WORD[op]} {b}?", answer


def in_heldout(prompt: str) -> bool:
    return hashlib.sha256(prompt.encode("utf-8")).digest()[0] % 3 == 0


def generate(split: SplitName, size: int, seed: int) -> list[Example]:
    rng = random.Random(f"headedit-arithmetic:{seed}")
    want_heldout = split == "heldout"
    seen: set[str] = set()
    out: list[Example] = []
    tries = 0
    while len(out) < size:
        tries += 1
        if tries > 50 * size + 1000:
            raise TaskError(f"cannot generate {size} distinct arithmetic problems", "ask for fewer examples")
        family = FAMILIES[tries % len(FAMILIES)]
        question, answer = make_problem(family, rng)
        prompt = f"Question: {question}\nAnswer:"
        if prompt in seen or in_heldout(prompt) != want_heldout:
            continue
        seen.add(prompt)
        out.append(Example(len(out), prompt, target=f" {answer}", meta={"family": family, "answer": answer}))
    return out


class ArithmeticTask(Task):
    name = "arithmetic"
    kind = "exact"
    metric = "acc"
    dataset_id = "EleutherAI/arithmetic"
    default_sizes = (2000, 1000)
    max_new_tokens = 16

    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        if split not in ("discovery", "heldout"):
            raise TaskError(f"unknown split {split!r}", "use discovery or heldout")
        n = self.default_sizes[0 if split == "discovery" else 1] if size is None else int(size)
        if not 0 < n <= MAX_SIZE:
            raise TaskError(f"arithmetic size {n} out of range", f"use 1..{MAX_SIZE}")
        examples = generate(split, n, seed)
        return Split(self.name, split, examples, f"generated arithmetic, seed {seed}, families {','.join(FAMILIES)}")

    def check(self, example: Example, generated: str) -> bool:
        return generated.strip() == (example.target or "").strip()


register_task(ArithmeticTask())
