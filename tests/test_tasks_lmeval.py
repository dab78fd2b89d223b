"""lm-eval task files through headedit agree with `lm_eval` itself, document by document.

Each test writes a task YAML, runs lm-eval's own `simple_evaluate` (HF backend, batch size 1, `log_samples`) on a
model folder, and scores the same documents with headedit's engine through `get_task(YAML)`: every document's
verdict must match lm-eval's metric for it. Ablated head sets are compared with lm-eval run on the checkpoint
`headedit.export.bake.bake` wrote. Models: the tiny random Llama (`headedit.bench.tiny`, a mix of right and
wrong answers on BoolQ/HellaSwag) and the bundled demo model (copy tasks, where head 0.0 flips the answer).
Real rows come from $HEADEDIT_DATA_DIR (skipped without it); the demo tasks need no data.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

lm_eval = pytest.importorskip("lm_eval")

DATA = os.environ.get("HEADEDIT_DATA_DIR")
needs_data = pytest.mark.skipif(not DATA or not Path(DATA, "boolq").is_dir(), reason="needs HEADEDIT_DATA_DIR")
ABLATED = "0.0,0.1,1.0"  # a head set that changes many BoolQ answers of the tiny Llama (seed 1)
SEED = 1  # tiny Llama seed: 8 of the 16 BoolQ rows right, so agreement is not trivially "all yes"


# ---- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The tiny random Llama, its bake with ABLATED zeroed, the demo model and its bake with 0.0 zeroed."""
    from testkit.models import save_tiny

    from headedit.export.bake import bake
    from headedit.model.bundled import DEMO_ID, bundled_model_path

    root = tmp_path_factory.mktemp("lmeval")
    tiny = save_tiny(root / "tiny", seed=SEED)
    return {"tiny": tiny, "tiny_baked": bake(tiny, ABLATED, root / "tiny_baked"),
            "demo": bundled_model_path(DEMO_ID), "demo_baked": bake(DEMO_ID, "0.0", root / "demo_baked")}


@pytest.fixture(scope="module")
def models(folders) -> dict[str, Any]:
    """headedit engines and lm-eval HFLMs, loaded once per folder."""
    from lm_eval.models.huggingface import HFLM

    from headedit.engine.core import Engine
    from headedit.model.loading import load_model

    cache: dict[str, Any] = {}

    def get(kind: str, name: str) -> Any:
        key = f"{kind}:{name}"
        if key not in cache:
            if kind == "engine":
                model, tok, layout = load_model(str(folders[name]))
                cache[key] = Engine(model, tok, layout, batch_size=4)
            else:
                cache[key] = HFLM(pretrained=str(folders[name]), batch_size=1, device="cpu", dtype="float32")
        return cache[key]

    return {"get": get}


def run_lm_eval(lm: Any, yaml_path: Path, limit: int | None = None) -> dict[int, dict[str, Any]]:
    """lm-eval's own per-document samples (first filter), by document id."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model=lm, tasks=[str(yaml_path)], task_manager=TaskManager(include_defaults=False),
                          limit=limit, log_samples=True, bootstrap_iters=0)
    (samples,) = out["samples"].values()
    first = samples[0]["filter"]
    return {s["doc_id"]: s for s in samples if s["filter"] == first}


def all_examples(task: Any) -> list[Any]:
    """Every document of the task (discovery and held-out), in document order."""
    merged = list(task.load("discovery").examples) + list(task.load("heldout").examples)
    return sorted(merged, key=lambda ex: ex.index)


def verdicts(engine: Any, task: Any, examples: list[Any], heads: str = "") -> list[bool]:
    from headedit.model.heads import parse_heads

    return [bool(v) for v in engine.correctness(task, examples, [parse_heads(heads, engine.layout)])[0]]


def check_choices(engine: Any, task: Any, examples: list[Any], heads: str, theirs: dict[int, dict[str, Any]],
                  metric: str) -> list[bool]:
    """Per document: the same verdict as lm-eval's metric, the same winning choice, and log-likelihoods equal
    to lm-eval's to float32 precision (the per-sample record headedit writes with --log-samples)."""
    from headedit.model.heads import parse_heads
    from headedit.tasks.samples import sample_records

    ours = verdicts(engine, task, examples, heads)
    assert ours == [theirs[ex.index][metric] == 1.0 for ex in examples]
    records = sample_records(engine, task, examples, parse_heads(heads, engine.layout), ours)
    for rec, ex in zip(records, examples):
        lls = [resp[0][0] for resp in theirs[ex.index]["resps"]]
        assert [c["logprob"] for c in rec["choices"]] == pytest.approx(lls, abs=2e-3)
        norm = rec["choices"][0].get("normalized") is not None
        assert norm == (metric == "acc_norm")
        assert rec["correct"] == (rec["pred"] == rec["label"])
    return ours


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def short_rows(folder: str, n: int, limit: int) -> list[dict[str, Any]]:
    """The first n rows of a local split whose text is short enough for the tiny model's context."""
    rows = []
    with open(Path(DATA or "", folder, "validation.jsonl")) as fh:
        for line in fh:
            row = json.loads(line)
            if len(json.dumps(row)) <= limit:
                rows.append(row)
            if len(rows) == n:
                break
    return rows


BOOLQ_YAML = """task: boolq_local
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data}
output_type: multiple_choice
validation_split: validation
doc_to_text: "{{{{passage}}}}\\nQuestion: {{{{question}}}}?\\nAnswer:"
doc_to_choice: ["no", "yes"]
doc_to_target: "{{{{answer | int}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""

HELLASWAG_UTILS = '''import re

def preprocess(text):
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\\\[.*?\\\\]", "", text)
    return text.replace("  ", " ")

def process_docs(dataset):
    def one(doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {"query": preprocess(doc["activity_label"] + ": " + ctx),
                "choices": [preprocess(e) for e in doc["endings"]], "gold": int(doc["label"])}
    return dataset.map(one)
'''

HELLASWAG_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data}
output_type: multiple_choice
validation_split: validation
num_fewshot: {shots}
process_docs: !function utils.process_docs
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def hellaswag_yaml(folder: Path, shots: int) -> Path:
    (folder / "utils.py").write_text(HELLASWAG_UTILS)
    data = write_rows(folder / "hellaswag.jsonl", short_rows("hellaswag", 16, 1000))
    path = folder / f"hellaswag{shots}.yaml"
    path.write_text(HELLASWAG_YAML.format(name=f"hellaswag_local{shots}", data=data, shots=shots))
    return path


# ---- multiple choice on real rows -------------------------------------------------------------------
@needs_data
def test_boolq_yaml_agrees_with_lm_eval_and_the_builtin_task(tmp_path, models):
    from headedit.tasks import get_task
    from headedit.tasks.boolq import BoolQTask

    rows = short_rows("boolq", 16, 900)
    path = tmp_path / "boolq.yaml"
    path.write_text(BOOLQ_YAML.format(data=write_rows(tmp_path / "boolq.jsonl", rows)))
    task = get_task(str(path))
    examples = all_examples(task)
    assert [ex.index for ex in examples] == list(range(16)) and task.kind == "choice"
    engine = models["get"]("engine", "tiny")
    theirs = run_lm_eval(models["get"]("hflm", "tiny"), path)
    ours = check_choices(engine, task, examples, "", theirs, "acc")
    assert 0 < sum(ours) < 16  # a mix, so agreement means something
    builtin = [BoolQTask.example(i, row) for i, row in enumerate(rows)]  # the second reference
    assert [(b.prompt, b.choices, b.label) for b in builtin] == [(e.prompt, e.choices, e.label) for e in examples]
    assert verdicts(engine, get_task("boolq"), builtin) == ours
    # the same documents with heads ablated agree with lm-eval on the baked checkpoint
    ablated = check_choices(engine, task, examples, ABLATED, run_lm_eval(models["get"]("hflm", "tiny_baked"), path),
                            "acc")
    assert ablated != ours


@needs_data
def test_hellaswag_with_process_docs_and_acc_norm_agrees(tmp_path, models):
    from headedit.tasks import get_task
    from headedit.tasks.hellaswag import HellaSwagTask

    path = hellaswag_yaml(tmp_path, 0)
    task = get_task(f"{path}#acc_norm")
    assert task.metric == "acc_norm" and task.length_normalize
    examples = all_examples(task)
    assert len(examples) == 16
    engine = models["get"]("engine", "tiny")
    theirs = run_lm_eval(models["get"]("hflm", "tiny"), path)
    ours = check_choices(engine, task, examples, "", theirs, "acc_norm")
    plain = get_task(str(path))  # the first metric, acc, without #
    assert check_choices(engine, plain, all_examples(plain), "", theirs, "acc") != ours
    builtin = [HellaSwagTask.example(i, row) for i, row in enumerate(short_rows("hellaswag", 16, 1000))]
    assert verdicts(engine, get_task("hellaswag"), builtin) == ours  # the built-in task, also acc_norm
    check_choices(engine, task, examples, ABLATED, run_lm_eval(models["get"]("hflm", "tiny_baked"), path), "acc_norm")


@needs_data
def test_few_shot_prompts_and_verdicts_agree(tmp_path, models):
    from headedit.tasks import get_task

    path = hellaswag_yaml(tmp_path, 2)
    task = get_task(str(path))
    examples = all_examples(task)
    theirs = run_lm_eval(models["get"]("hflm", "tiny"), path)
    for ex in examples:  # lm-eval's own sampler drew the same shots (seed 1234, documents in order)
        assert theirs[ex.index]["arguments"][0][0] == ex.prompt
        assert ex.prompt.count("\n\n") >= 2
    check_choices(models["get"]("engine", "tiny"), task, examples, "", theirs, "acc")


# ---- generation and loglikelihood on the demo model (no data needed) --------------------------------
def demo_rows(n: int) -> list[dict[str, str]]:
    from headedit.demo.data import index_pair, split_pairs

    pairs = [index_pair(i) for i in split_pairs("heldout")[:n]]
    return [{"a": f"{a:02d}", "b": f"{b:02d}", "first": f"0{a:02d}", "second": f"0{b:02d}"} for a, b in pairs]


WORDS = ("apple", "river", "stone", "cloud", "tiger", "music", "bread", "light", "paper", "green", "house", "water")

GENERATE_YAML = """task: words_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "Say a word after {{{{word}}}}:"
doc_to_target: "{{{{letter}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
filter_list:
  - name: first-letter
    filter:
      - function: regex
        regex_pattern: "([a-z])"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def word_rows() -> list[dict[str, str]]:
    """Prompts for the tiny random Llama; the reference is a letter its greedy text may start a word with."""
    return [{"word": w, "letter": "nsa"[i % 3]} for i, w in enumerate(WORDS + tuple(w.upper() for w in WORDS))]


LOGLIK_YAML = """task: demo_loglikelihood
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood
test_split: test
doc_to_text: "<bos>A {{{{a}}}}+{{{{b}}}}="
doc_to_target: "{{{{first}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_generation_with_until_and_regex_filter_agrees_intact_and_ablated(tmp_path, models):
    from headedit.model.heads import parse_heads
    from headedit.tasks import get_task
    from headedit.tasks.samples import sample_records

    path = tmp_path / "gen.yaml"
    path.write_text(GENERATE_YAML.format(data=write_rows(tmp_path / "words.jsonl", word_rows())))
    task = get_task(str(path))
    assert task.kind == "generate" and task.stop == ("\n", ".") and task.max_new_tokens == 8
    examples = all_examples(task)
    engine = models["get"]("engine", "tiny")
    texts = []
    for heads, folder in (("", "tiny"), (ABLATED, "tiny_baked")):
        theirs = run_lm_eval(models["get"]("hflm", folder), path)
        ours = verdicts(engine, task, examples, heads)
        assert ours == [theirs[ex.index]["exact_match"] == 1.0 for ex in examples]
        assert 0 < sum(ours) < len(ours)
        records = sample_records(engine, task, examples, parse_heads(heads, engine.layout), ours)
        assert [r["generated"] for r in records] == [theirs[ex.index]["resps"][0][0] for ex in examples]
        assert [r["filtered"] for r in records] == [theirs[ex.index]["filtered_resps"][0] for ex in examples]
        assert all("\n" not in r["generated"] and "." not in r["generated"] for r in records)
        texts.append([r["generated"] for r in records])
    assert texts[0] != texts[1]


def test_loglikelihood_acc_is_greedy_exact_match(tmp_path, models):
    from headedit.tasks import get_task

    path = tmp_path / "ll.yaml"
    path.write_text(LOGLIK_YAML.format(data=write_rows(tmp_path / "pairs.jsonl", demo_rows(24))))
    task = get_task(str(path))
    assert task.kind == "exact"
    examples = all_examples(task)
    engine = models["get"]("engine", "demo")
    for heads, folder in (("", "demo"), ("0.0", "demo_baked")):
        theirs = run_lm_eval(models["get"]("hflm", folder), path)
        assert verdicts(engine, task, examples, heads) == [theirs[i]["acc"] == 1 for i in range(24)]


# ---- what is refused -------------------------------------------------------------------------------
def test_corpus_level_metric_and_sampling_are_refused_in_one_line(tmp_path):
    from headedit.errors import TaskError
    from headedit.tasks import get_task

    data = write_rows(tmp_path / "words.jsonl", word_rows())
    bleu = GENERATE_YAML.format(data=data).replace("metric: exact_match", "metric: bleu")
    (tmp_path / "bleu.yaml").write_text(bleu.replace("aggregation: mean", "aggregation: bleu"))
    with pytest.raises(TaskError, match="metric bleu is corpus-level"):
        get_task(str(tmp_path / "bleu.yaml"))
    (tmp_path / "sample.yaml").write_text(GENERATE_YAML.format(data=data).replace("do_sample: false", "do_sample: true"))
    with pytest.raises(TaskError, match="samples its generations"):
        get_task(str(tmp_path / "sample.yaml"))
    with pytest.raises(TaskError, match="has no metric 'acc_norm'"):
        get_task(f"{tmp_path / 'sample.yaml'}#acc_norm")


def test_without_the_extra_a_task_file_names_pip_install(tmp_path):
    """lm-eval made unimportable: `headedit eval` on a YAML prints one line naming the extra, exit 2."""
    (tmp_path / "t.yaml").write_text("task: t\n")
    code = ("import sys; sys.modules['lm_eval'] = None\n"
            "from headedit.cli import main\n"
            f"sys.exit(main(['eval', 'headedit:demo', '--task', {str(tmp_path / 't.yaml')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "pip install 'headedit[lmeval]'" in proc.stderr, proc.stderr
