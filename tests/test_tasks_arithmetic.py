"""Arithmetic task: lm-eval prompt format, correct answers, deterministic disjoint splits."""
from __future__ import annotations

import re

import pytest

from headedit.errors import TaskError
from headedit.tasks import get_task

PROMPT = re.compile(r"^Question: What is (\d+ (plus|minus|times) \d+|\(\d [-+*] \d\) [-+*] \d)\?\nAnswer:$")


def test_prompts_targets_and_families():
    split = get_task("arithmetic").load("discovery", 200, seed=0)
    assert len(split) == 200 and [e.index for e in split.examples] == list(range(200))
    families = set()
    for ex in split.examples:
        assert PROMPT.match(ex.prompt), ex.prompt
        expr = ex.prompt[len("Question: What is "):-len("?\nAnswer:")]
        expr = expr.replace("plus", "+").replace("minus", "-").replace("times", "*")
        assert ex.target == f" {eval(expr)}"  # noqa: S307 - digits and operators only (matched above)
        families.add(ex.meta["family"])
    assert families == {"2da", "3da", "4da", "5da", "2ds", "3ds", "4ds", "5ds", "2dm", "1dc"}


def test_deterministic_and_disjoint():
    task = get_task("arithmetic")
    a = task.load("discovery", 300, seed=3)
    assert [e.prompt for e in a.examples] == [e.prompt for e in task.load("discovery", 300, seed=3).examples]
    assert [e.prompt for e in task.load("discovery", 100, seed=3).examples] == [e.prompt for e in a.examples[:100]]
    held = task.load("heldout", 300, seed=3)
    assert not {e.prompt for e in a.examples} & {e.prompt for e in held.examples}
    assert len({e.prompt for e in a.examples}) == 300
    assert [e.prompt for e in task.load("discovery", 50, seed=4).examples] != [e.prompt for e in a.examples[:50]]
    assert len(task.load("discovery").examples) == 2000 and len(task.load("heldout").examples) == 1000


def test_bad_sizes():
    with pytest.raises(TaskError):
        get_task("arithmetic").load("discovery", 0)
    with pytest.raises(TaskError):
        get_task("arithmetic").load("train", 5)  # type: ignore[arg-type]
