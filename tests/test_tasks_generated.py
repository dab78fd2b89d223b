"""MBPP and GSM8K: lm-eval prompt text, split sizes and determinism, and scoring (sandboxed for MBPP)."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from headedit.errors import TaskError
from headedit.tasks import get_task, task_names
from headedit.tasks.gsm8k import extract_answer, is_correct, normalize
from headedit.tasks.mbpp import extract_program

REAL = os.environ.get("HEADEDIT_DATA_DIR")
realdata = pytest.mark.skipif(not REAL, reason="HEADEDIT_DATA_DIR is not set")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def mbpp_row(task_id: int, n: int) -> dict:
    return {"task_id": task_id, "text": f"Write a function to add {n}.", "code": f"def add_{n}(x):\r\n  return x + {n}",
            "test_list": [f"assert add_{n}(0) == {n}", f"assert add_{n}(1) == {n + 1}", f"assert add_{n}(-{n}) == 0"],
            "test_setup_code": "", "challenge_test_list": []}


@pytest.fixture
def mbpp_dir(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "mbpp" / "prompt.jsonl", [mbpp_row(t, t) for t in range(1, 6)])
    write_jsonl(tmp_path / "mbpp" / "train.jsonl", [mbpp_row(600 + i, 10 + i) for i in range(8)])
    write_jsonl(tmp_path / "mbpp" / "test.jsonl", [mbpp_row(20 + i, 30 + i) for i in range(6)])
    return tmp_path


def test_tasks_are_registered():
    assert {"mbpp", "gsm8k"} <= set(task_names())
    mbpp, gsm = get_task("mbpp"), get_task("gsm8k")
    assert (mbpp.kind, mbpp.metric, mbpp.stop, mbpp.default_sizes) == ("generate", "pass@1", ("[DONE]",), (374, 500))
    assert (gsm.kind, gsm.metric) == ("generate", "exact_match")
    assert gsm.stop == ("Question:", "</s>", "<|im_end|>")
    assert mbpp.dataset_id == "google-research-datasets/mbpp" and gsm.dataset_id == "openai/gsm8k"


def test_mbpp_prompt_is_lm_eval_three_shot(mbpp_dir):
    split = get_task("mbpp").load("heldout", data_dir=mbpp_dir)
    shot = ("You are an expert Python programmer, and here is your task: Write a function to add {n}. "
            "Your code should pass these tests:\n\nassert add_{n}(0) == {n}\nassert add_{n}(1) == {m}\n"
            "assert add_{n}(-{n}) == 0\n[BEGIN]\ndef add_{n}(x):\r\n  return x + {n}\n[DONE]\n\n")
    expected = "".join(shot.format(n=n, m=n + 1) for n in (2, 3, 4)) + (
        "You are an expert Python programmer, and here is your task: Write a function to add 30. "
        "Your code should pass these tests:\n\nassert add_30(0) == 30\nassert add_30(1) == 31\n"
        "assert add_30(-30) == 0\n[BEGIN]\n")
    assert split.examples[0].prompt == expected
    assert split.examples[0].index == 0 and split.examples[0].meta["task_id"] == 20


def test_mbpp_splits_sizes_and_determinism(mbpp_dir):
    task = get_task("mbpp")
    disc, held = task.load("discovery", data_dir=mbpp_dir), task.load("heldout", data_dir=mbpp_dir)
    assert (len(disc), len(held)) == (8, 6)
    assert [e.index for e in disc.examples] == list(range(8))
    assert "train" in disc.source and "test" in held.source
    sub = task.load("discovery", size=3, seed=5, data_dir=mbpp_dir)
    again = task.load("discovery", size=3, seed=5, data_dir=mbpp_dir)
    assert [e.index for e in sub.examples] == [e.index for e in again.examples]
    assert len(sub) == 3 and all(e.prompt == disc.examples[e.index].prompt for e in sub.examples)
    with pytest.raises(TaskError):
        task.load("discovery", size=9, data_dir=mbpp_dir)
    with pytest.raises(TaskError):
        task.load("validation", data_dir=mbpp_dir)  # type: ignore[arg-type]


def test_mbpp_missing_local_split_is_a_clear_error(tmp_path):
    write_jsonl(tmp_path / "mbpp" / "train.jsonl", [mbpp_row(600, 1)])
    with pytest.raises(TaskError) as err:
        get_task("mbpp").load("discovery", data_dir=tmp_path)
    assert "prompt" in str(err.value) and err.value.hint


def test_mbpp_scores_right_and_wrong_programs_in_the_sandbox(mbpp_dir):
    task = get_task("mbpp")
    ex = task.load("heldout", data_dir=mbpp_dir).examples[0]  # add_30
    right = "def add_30(x):\n    return x + 30\n"
    wrong = "def add_30(x):\n    return x + 3\n"
    assert task.check(ex, right + "[DONE]\nprint('after the stop')")
    assert not task.check(ex, wrong + "[DONE]")
    assert not task.check(ex, "import sys\nsys.exit(0)\n" + right)
    assert not task.check(ex, "while True:\n    pass\n")
    assert task.check(ex, "\n" + right + "```\n```python\nprint('a second block')\n```")  # first block wins
    # lm-eval quirk, kept for comparability: its filter prepends ``` so a generation opening its own fence
    # yields an empty first block, and the program fails
    assert not task.check(ex, "```python\n" + right + "```\nSome prose after the block")
    assert task.check(ex, right + "[DONE]\n" + "def add_30(x):\n    return 0")  # what follows the stop is cut
    examples = task.load("heldout", data_dir=mbpp_dir).examples
    gens = [f"def add_{30 + i}(x):\n    return x + {30 + i if i % 2 == 0 else 0}\n" for i in range(len(examples))]
    assert task.check_many(examples, gens, workers=3) == [i % 2 == 0 for i in range(len(examples))]


def test_mbpp_program_extraction_follows_lm_eval():
    prefix = "from __future__ import annotations\n"
    assert extract_program("def f():\n    return 1\n") == prefix + "def f():\n    return 1\n"
    # lm-eval's `extract_code_blocks` applied to "```" + text: the quirks are kept on purpose
    assert extract_program("```python\ndef f(): pass\n```\ntext") == prefix
    assert extract_program("def g(): pass\n```\nrest") == prefix + " g(): pass"  # `def` read as a language tag
    assert extract_program("\nx = 1\n```\nrest") == prefix + "x = 1"


def gsm_row(q: int) -> dict:
    return {"question": f"What is {q} + {q}?", "answer": f"{q} + {q} = <<{q}+{q}={2 * q}>>{2 * q}.\n#### {2 * q:,}"}


@pytest.fixture
def gsm_dir(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "gsm8k" / "train.jsonl", [gsm_row(1000 + i) for i in range(40)])
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [gsm_row(i) for i in range(12)])
    return tmp_path


def test_gsm8k_prompt_is_lm_eval_five_shot(gsm_dir):
    task = get_task("gsm8k")
    held = task.load("heldout", size=12, data_dir=gsm_dir)
    train = [gsm_row(1000 + i) for i in range(40)]
    for ex in held.examples:
        blocks = ex.prompt.split("\n\n")
        assert len(blocks) == 6
        assert blocks[-1] == f"Question: What is {ex.index} + {ex.index}?\nAnswer:"
        for block in blocks[:5]:
            assert block.startswith("Question: ") and "\nAnswer: " in block
            question, answer = block[len("Question: "):].split("\nAnswer: ")
            assert {"question": question, "answer": answer} in train
    # lm-eval's default sampler: Random(1234), one 5-sample draw per document in order
    rnd = random.Random(1234)
    first = [train[i] for i in rnd.sample(range(40), 5)]
    assert held.examples[0].prompt.startswith(f"Question: {first[0]['question']}\nAnswer: {first[0]['answer']}\n\n")


def test_gsm8k_discovery_never_shows_the_question_itself(gsm_dir):
    task = get_task("gsm8k")
    disc = task.load("discovery", size=40, data_dir=gsm_dir)
    assert len(disc) == 40
    for ex in disc.examples:
        own = f"Question: What is {1000 + ex.index} + {1000 + ex.index}?\nAnswer:"
        assert ex.prompt.count(own) == 1 and ex.prompt.endswith(own)


def test_gsm8k_splits_sizes_and_determinism(gsm_dir):
    task = get_task("gsm8k")
    a = task.load("discovery", size=10, seed=3, data_dir=gsm_dir)
    b = task.load("discovery", size=10, seed=3, data_dir=gsm_dir)
    c = task.load("discovery", size=10, seed=4, data_dir=gsm_dir)
    assert [e.index for e in a.examples] == [e.index for e in b.examples] != [e.index for e in c.examples]
    assert [e.prompt for e in a.examples] == [e.prompt for e in b.examples]
    full = {e.index: e.prompt for e in task.load("discovery", size=40, data_dir=gsm_dir).examples}
    assert all(full[e.index] == e.prompt for e in a.examples)  # a row's prompt does not depend on the subset
    assert len(task.load("heldout", size=5, data_dir=gsm_dir)) == 5
    with pytest.raises(TaskError):
        task.load("heldout", size=13, data_dir=gsm_dir)


@pytest.mark.parametrize("generated, answer, correct", [
    (" 2 + 2 = 4\n#### 4", "#### 4", True),
    (" It is #### 1,000.", "so 1000\n#### 1,000", True),  # commas and one trailing dot ignored
    (" #### $18", "#### 18", False),  # strict-match needs the digits right after '#### '
    (" The answer is 4", "#### 4", False),  # no '#### ': [invalid]
    (" #### -3", "#### -3", True),
    (" #### 4\n#### 5", "#### 5", False),  # the first match counts
    (" #### 18.00", "#### 18", False),  # exact string match after normalisation, as lm-eval
    (" 2 + 2\n\nQuestion: next #### 9", "#### 9", False),  # cut at the stop sequence
    (" #### 7</s>#### 8", "#### 7", True),
])
def test_gsm8k_answer_extraction(generated, answer, correct):
    assert is_correct(generated, answer, get_task("gsm8k").stop) is correct


def test_gsm8k_helpers():
    assert extract_answer("x #### 1,234.5 y") == "1,234.5"
    assert extract_answer("nothing") == "[invalid]"
    assert normalize("Janet sells 9 eggs.\n#### 1,018") == "1018"


@realdata
@pytest.mark.realdata
def test_mbpp_real_splits_and_prompt():
    task = get_task("mbpp")
    disc, held = task.load("discovery", data_dir=REAL), task.load("heldout", data_dir=REAL)
    assert (len(disc), len(held)) == (374, 500)
    assert held.examples[0].meta["task_id"] == 11 and disc.examples[0].meta["task_id"] == 601
    prompt = held.examples[0].prompt
    assert prompt.count("[BEGIN]\n") == 4 and prompt.count("\n[DONE]\n\n") == 3
    assert prompt.startswith("You are an expert Python programmer, and here is your task: Write a function to find "
                             "the similar elements from the given two tuple lists. Your code should pass these tests:"
                             "\n\nassert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\n")
    assert "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n  return (res) \n[DONE]\n\n" in prompt
    assert "import heapq as hq\r\n" in prompt and "def is_not_prime(n):" in prompt
    assert prompt.endswith("Your code should pass these tests:\n\n" + "\n".join(held.examples[0].meta["tests"]) + "\n[BEGIN]\n")


@realdata
@pytest.mark.realdata
def test_mbpp_real_reference_solutions_pass_and_broken_ones_fail():
    task = get_task("mbpp")
    held = task.load("heldout", data_dir=REAL)
    rows = [json.loads(line) for line in (Path(REAL) / "mbpp" / "test.jsonl").read_text().splitlines() if line.strip()]
    picks = [held.examples[i] for i in (0, 1, 7, 50, 499)]
    refs = [rows[e.index]["code"] for e in picks]
    assert task.check_many(picks, [r + "\n[DONE]" for r in refs]) == [True] * len(picks)
    broken = [r + "\n" + "\n".join(f"def {name}(*a, **k):\n    return None" for name in _defined(r)) for r in refs]
    assert task.check_many(picks, broken) == [False] * len(picks)


def _defined(code: str) -> list[str]:
    return [line.split("def ", 1)[1].split("(")[0].strip() for line in code.splitlines() if line.startswith("def ")]


@realdata
@pytest.mark.realdata
def test_gsm8k_real_sizes_and_references():
    task = get_task("gsm8k")
    disc, held = task.load("discovery", data_dir=REAL), task.load("heldout", data_dir=REAL)
    assert (len(disc), len(held)) == (1000, 1319)
    assert not set(e.index for e in disc.examples) - set(range(7473))
    assert held.examples[0].prompt.endswith("Question: Janet\u2019s ducks lay 16 eggs per day. She eats three for "
                                            "breakfast every morning and bakes muffins for her friends every day with "
                                            "four. She sells the remainder at the farmers' market daily for $2 per "
                                            "fresh duck egg. How much in dollars does she make every day at the "
                                            "farmers' market?\nAnswer:")
    assert held.examples[0].meta["reference"] == "18"
    assert all(task.check(e, " " + e.meta["answer"]) for e in held.examples)  # references score themselves
    assert [e.index for e in task.load("discovery", data_dir=REAL).examples] == [e.index for e in disc.examples]
