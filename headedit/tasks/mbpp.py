"""MBPP: 3-shot Python program synthesis, pass@1 by running the row's three asserts in the sandbox.

Follows lm-evaluation-harness `lm_eval/tasks/mbpp/mbpp.yaml` + `utils.py` (EleutherAI, read via the code
index): doc_to_text `You are an expert Python programmer, and here is your task: {{text}} Your code should
pass these tests:\\n\\n{{test_list[0]}}\\n{{test_list[1]}}\\n{{test_list[2]}}\\n[BEGIN]\\n`, few-shot target
`{{code}}\\n[DONE]`, target_delimiter "", fewshot_delimiter "\\n\\n" (lm-eval's default), sampler first_n over
the shots with task ids 2, 3, 4, greedy until `[DONE]`. Scoring as its `build_predictions` filter + HF
`code_eval`: take the first fenced code block if there is one, prefix `from __future__ import annotations`,
append the asserts joined by newlines, exec in empty globals with a 3 s limit; `test_setup_code` is not used.
"""
from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, Sequence

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.data import carve, load_rows
from headedit.tasks.registry import register_task
from headedit.tasks.sandbox import Program, SandboxResult, run_many, run_program

PROMPT = (
    "You are an expert Python programmer, and here is your task: {text} "
    "Your code should pass these tests:\n\n{tests}\n[BEGIN]\n"
)
SHOT_TARGET = "{code}\n[DONE]"
FEWSHOT_DELIMITER = "\n\n"
SHOT_TASK_IDS = (2, 3, 4)
FUTURE_PREFIX = "from __future__ import annotations\n"
_FENCED = re.compile(r"```(?:\w+)?\n?(.*?)\n?```", re.DOTALL)


def doc_to_text(row: dict[str, Any]) -> str:
    return PROMPT.format(text=row["text"], tests="\n".join(row["test_list"][:3]))


def build_prompt(row: dict[str, Any], shots: Sequence[dict[str, Any]]) -> str:
    """The exact lm-eval context: each shot's text + code + `\\n[DONE]`, `\\n\\n` between, then the row's text."""
    context = "".join(doc_to_text(s) + SHOT_TARGET.format(code=s["code"]) + FEWSHOT_DELIMITER for s in shots)
    return context + doc_to_text(row)


def truncate_at_stop(text: str, stops: Sequence[str]) -> str:
    """As lm-eval's HF backend: cut the continuation at each stop sequence in turn."""
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


def extract_program(generated: str) -> str:
    """lm-eval's mbpp filter: the first ``` block if any (the generation may open one), else the whole text."""
    matches = _FENCED.findall("```" + generated)
    if not matches:
        matches = _FENCED.findall(re.sub(r"```python", "```", generated))
    return FUTURE_PREFIX + (matches[0] if matches else generated)


class MBPPTask(Task):
    name = "mbpp"
    kind = "generate"
    metric = "pass@1"
    dataset_id = "google-research-datasets/mbpp"
    config = "full"
    folder = "mbpp"
    default_sizes = (374, 500)  # the paper's: all of train / all of test
    max_new_tokens = 256  # lm-eval's default max_gen_toks
    stop = ("[DONE]",)
    source_splits: dict[str, str] = {"discovery": "train", "heldout": "test"}
    timeout_s = 3.0  # HF code_eval's default, as lm-eval uses it
    memory_mb = 512

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[str, ...], str], bool] = {}
        self._lock = threading.Lock()

    def shots(self, data_dir: Path | str | None = None) -> list[dict[str, Any]]:
        rows, _ = load_rows(self.dataset_id, "prompt", self.folder, data_dir, self.config)
        by_id = {int(r["task_id"]): r for r in rows}
        missing = [t for t in SHOT_TASK_IDS if t not in by_id]
        if missing:
            raise TaskError(f"MBPP prompt split lacks the few-shot task ids {missing}",
                            "use the hub's prompt split (task ids 1-10) in mbpp/prompt.jsonl")
        return [by_id[t] for t in SHOT_TASK_IDS]

    def load(self, split: SplitName, size: int | None = None, seed: int = 0,
             data_dir: Path | str | None = None) -> Split:
        if split not in self.source_splits:
            raise TaskError(f"unknown split {split!r}", "use discovery or heldout")
        source = self.source_splits[split]
        rows, where = load_rows(self.dataset_id, source, self.folder, data_dir, self.config)
        if size is None or size == len(rows):
            picked, which = list(range(len(rows))), f"all {len(rows)} rows"
        elif 0 < size < len(rows):
            picked, which = carve(rows, (size, 0), seed, 0), f"{size} of {len(rows)} rows (seed {seed})"
        else:
            raise TaskError(f"requested {size} {split} examples but MBPP {source} has {len(rows)} rows",
                            f"ask for 1..{len(rows)} examples")
        shots = self.shots(data_dir)
        examples = []
        for i in picked:
            row = rows[i]
            if len(row.get("test_list") or ()) < 3:
                raise TaskError(f"MBPP {source} row {i} has fewer than 3 tests", "check the data file")
            examples.append(Example(index=i, prompt=build_prompt(row, shots),
                                    meta={"task_id": int(row["task_id"]), "tests": tuple(row["test_list"][:3])}))
        return Split(task=self.name, name=split, examples=examples, source=f"{where}: {which}")

    def program(self, generated: str) -> str:
        return extract_program(truncate_at_stop(generated, self.stop))

    def run(self, example: Example, generated: str) -> SandboxResult:
        """The sandbox's full verdict (status and reason), uncached."""
        return run_program(self.program(generated), list(example.meta["tests"]),
                           timeout_s=self.timeout_s, memory_mb=self.memory_mb)

    def check(self, example: Example, generated: str) -> bool:
        return self.check_many([example], [generated])[0]

    def check_many(self, examples: Sequence[Example], generations: Sequence[str],
                   workers: int | None = None) -> list[bool]:
        """pass@1 for many rows at once on a bounded pool; identical (tests, program) pairs run once."""
        if len(examples) != len(generations):
            raise ValueError("examples and generations differ in length")
        keys = [(tuple(ex.meta["tests"]), self.program(gen)) for ex, gen in zip(examples, generations)]
        with self._lock:
            todo = list({k: None for k in keys if k not in self._cache})
        if todo:
            results = run_many([Program(prog, list(tests)) for tests, prog in todo],
                               timeout_s=self.timeout_s, memory_mb=self.memory_mb, workers=workers)
            with self._lock:
                if len(self._cache) > 100_000:
                    self._cache.clear()
                for key, res in zip(todo, results):
                    if res.status != "error":  # a sandbox failure is not the program's verdict: retry later
                        self._cache[key] = res.passed
            fresh = dict(zip(todo, results))
        else:
            fresh = {}
        with self._lock:
            return [self._cache[k] if k in self._cache else fresh[k].passed for k in keys]


TASK = register_task(MBPPTask())
