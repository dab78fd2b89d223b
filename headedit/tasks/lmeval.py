"""lm-evaluation-harness tasks (a task YAML, or a name from lm-eval's registry), built by lm-eval itself.

lm-eval (the optional extra `headedit[lmeval]`) loads the config, the data (`process_docs` and `!function` included)
and builds every document's requests with its own few-shot sampler, seeded as `lm_eval` seeds it (1234). Those
requests become headedit examples, which the engine scores under every ablation set; lm-eval's own filters and
`process_results` decide each document's correctness for the chosen metric (`headedit.tasks.lmeval_results`):
- `multiple_choice` -> a choice example: context + one continuation per choice; acc takes the highest summed
  log-likelihood, acc_norm divides by the choice's length in characters, acc_bytes in UTF-8 bytes (as lm-eval);
- `loglikelihood` with acc -> an exact example (the continuation is the greedy one, lm-eval's `is_greedy`);
- `generate_until` (greedy) -> a generated example: greedy output up to `until` / `max_gen_toks`, then the filter
  pipeline and the metric.
Which metric and filter: the first of `metric_list` and of `filter_list`, or the ones a reference names after `#`
(`task.yaml#acc_norm`, `gsm8k.yaml#exact_match,flexible-extract`). Corpus-level metrics (bleu, perplexity, f1 over
the corpus, ...) are refused: discovery needs per-document correctness.

Splits: held-out is lm-eval's evaluated split (test, else validation), in its order, with lm-eval's document ids
as example indices. Discovery is the training split when the task has one; otherwise both are carved from the
evaluated split without overlap by a seeded shuffle (the split's note says so). Prompts of the evaluated split are
built for every document in order up to the last one picked, exactly as `lm_eval` builds them (`--limit N` gives the
first N), so each document's prompt does not depend on which others were picked.
Env vars in `dataset_kwargs.data_files` (`${HEADEDIT_DATA_DIR}/boolq/validation.jsonl`) are expanded by headedit;
plain `lm_eval` does not expand them.
"""
from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.boolq import pick
from headedit.tasks.lmeval_results import Scoring, choose_scoring
from headedit.tasks.source import TaskSource, file_entry

FEWSHOT_SEED = 1234  # lm_eval.simple_evaluate's default fewshot_random_seed
DISCOVERY_POOL = 2000
EXTRA = "pip install 'headedit[lmeval]'"
QUIET_LOGGERS = ("lm_eval", "lm-eval", "datasets", "fsspec", "filelock")


def require_lm_eval(what: str) -> None:
    """One line naming the extra when lm-eval is not installed (or cannot be imported)."""
    try:
        import lm_eval  # noqa: F401  (optional extra; its top level is light, the task modules are not)
    except ImportError:
        raise TaskError(f"{what} is an lm-eval task, which needs the lm-eval package", EXTRA) from None


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    text = text if len(text) <= 240 else text[:237] + "..."
    return f"{type(err).__name__}: {text}"


@contextmanager
def quiet() -> Iterator[None]:
    """lm-eval's and datasets' progress bars and warnings off while we build (our own output stays one line)."""
    before_env = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    from datasets.utils import logging as ds_logging  # datasets' bars ignore TQDM_DISABLE

    bars = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            ds_logging.enable_progress_bar()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if before_env is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before_env


def cache_templates() -> None:
    """Compile each of lm-eval's jinja templates once: lm-eval compiles the template string on every call (about
    3 ms each, most of the time of building BoolQ's prompts). The compiled template renders exactly the same."""
    from functools import lru_cache

    from lm_eval import utils  # optional extra

    if not getattr(utils.env.from_string, "cache_info", None):
        utils.env.from_string = lru_cache(maxsize=4096)(utils.env.from_string)  # type: ignore[method-assign]


def expand_data_files(cfg: dict[str, Any], label: str) -> dict[str, Any]:
    """`dataset_kwargs.data_files` with environment variables and `~` expanded; an unset variable is an error."""
    kwargs = cfg.get("dataset_kwargs")
    if not isinstance(kwargs, dict) or "data_files" not in kwargs:
        return cfg

    def expand(value: Any) -> Any:
        if isinstance(value, str):
            out = os.path.expanduser(os.path.expandvars(value))
            unset = re.search(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", out)
            if unset:
                raise TaskError(f"{label}: data_files uses ${unset.group(1)}, which is not set",
                                f"export {unset.group(1)}=FOLDER, or write the path out")
            return out
        if isinstance(value, list):
            return [expand(v) for v in value]
        if isinstance(value, dict):
            return {k: expand(v) for k, v in value.items()}
        return value

    return {**cfg, "dataset_kwargs": {**kwargs, "data_files": expand(kwargs["data_files"])}}


def local_files(value: Any) -> list[Path]:
    """The existing local files named in a data_files value (str, list or dict of them)."""
    if isinstance(value, str):
        path = Path(value)
        return [path] if path.is_file() else []
    if isinstance(value, list):
        return [p for v in value for p in local_files(v)]
    if isinstance(value, dict):
        return [p for v in value.values() for p in local_files(v)]
    return []


def definition_files(path: Path, seen: set[Path] | None = None) -> list[Path]:
    """Files a task YAML is made of besides itself: included YAMLs and the modules its `!function`s load."""
    seen = seen if seen is not None else {path.resolve()}
    out: list[Path] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return out
    for qual in re.findall(r"!function\s+([\w.]+)", text):
        module = path.parent / (qual.rpartition(".")[0].replace(".", "/") + ".py")
        if module.is_file() and module.resolve() not in seen:
            seen.add(module.resolve())
            out.append(module)
    includes = re.findall(r"^include:\s*['\"]?([^'\"\s#]+)", text, flags=re.MULTILINE)
    for inc in includes:
        target = (path.parent / inc) if not Path(inc).is_absolute() else Path(inc)
        if target.is_file() and target.resolve() not in seen:
            seen.add(target.resolve())
            out.append(target)
            out.extend(definition_files(target, seen))
    return out


class LmEvalTask(Task):
    """One lm-eval task (see the module docstring). Building it loads lm-eval, the config and the data."""

    def __init__(self, reference: str, path: Path | None = None, lm_eval_name: str | None = None,
                 include_path: str | None = None, pick: str | None = None) -> None:
        self.name = reference
        self.path = path
        self.include_path = include_path
        self.label = path.name if path is not None else f"lm-eval task {lm_eval_name}"
        require_lm_eval(self.label)
        self.lm_task = self._build(lm_eval_name)
        self.task_name = str(self.lm_task.config.task)
        self.scoring: Scoring = choose_scoring(self.lm_task, pick, self.label)
        self.kind = self.scoring.kind
        self.metric = self.scoring.metric
        self.length_normalize = self.scoring.normalize is not None
        self.max_new_tokens = self.scoring.max_gen_toks
        self.stop = self.scoring.until
        cfg = self.lm_task.config
        self.dataset_id = cfg.dataset_path if cfg.dataset_path not in (None, "json", "csv", "parquet", "text") else None
        self.eval_split = str(cfg.test_split or cfg.validation_split)
        with quiet():
            try:
                self.eval_docs = list(self.lm_task.eval_docs)
                train = cfg.training_split
                self.train_docs = (list(self.lm_task.training_docs())
                                   if train and train != self.eval_split and self.lm_task.has_training_docs() else [])
            except Exception as err:  # noqa: BLE001 - lm-eval and datasets raise anything; one line for the user
                raise TaskError(f"{self.label}: lm-eval cannot load its documents: {one_line(err)}",
                                "check the splits and process_docs") from None
        if not self.eval_docs:
            raise TaskError(f"{self.label}: the {self.eval_split} split has no documents", "check data_files")
        n = len(self.eval_docs)
        pool = min(DISCOVERY_POOL, len(self.train_docs)) if self.train_docs else min(DISCOVERY_POOL, n // 2)
        self.default_sizes = (pool, n if self.train_docs else n - pool)
        self._built: dict[str, list[Example]] = {"eval": [], "train": []}

    # ---- building ------------------------------------------------------------------------------
    def _build(self, lm_eval_name: str | None) -> Any:
        with quiet():
            # optional extra, heavy: imported only when an lm-eval task is used
            from lm_eval.tasks import TaskManager
            from lm_eval.tasks._yaml_loader import load_yaml

            cache_templates()
            spec: Any
            if self.path is not None:
                if not self.path.is_file():
                    raise TaskError(f"task file {self.path} not found", "check the path")
                try:
                    cfg = load_yaml(self.path, resolve_func=True, recursive=True)
                except Exception as err:  # noqa: BLE001 - lm-eval and datasets raise anything; one line for the user
                    raise TaskError(f"{self.label}: lm-eval cannot load it: {one_line(err)}",
                                    "fix the YAML (lm_eval reports the same)") from None
                if "group" in cfg or not isinstance(cfg.get("task"), str):
                    raise TaskError(f"{self.label} defines a group of tasks, not one task",
                                    "name one task's YAML (a group's members each have their own)")
                spec = expand_data_files(cfg, self.label)
                manager = TaskManager(include_defaults=False)  # the dict needs no index (includes are resolved)
            else:
                assert lm_eval_name is not None
                # the user's folder alone first (indexing all of lm-eval's own tasks takes ~10 s)
                manager = TaskManager(include_path=self.include_path, include_defaults=False) if self.include_path \
                    else None
                if manager is None or lm_eval_name not in manager.all_tasks:
                    manager = TaskManager(include_path=self.include_path, include_defaults=True)
                if lm_eval_name not in manager.all_tasks:
                    raise TaskError(f"lm-eval knows no task {lm_eval_name!r}",
                                    "check the name (`lm_eval ls tasks`) or task.include_path")
                spec = lm_eval_name
            try:
                tasks = manager.load(spec)["tasks"]
            except TaskError:
                raise
            except Exception as err:  # noqa: BLE001 - lm-eval and datasets raise anything; one line for the user
                offline = "ConnectionError" in type(err).__name__ or "reach" in str(err) or "offline" in str(err).lower()
                raise TaskError(f"{self.label}: lm-eval cannot build the task: {one_line(err)}",
                                "offline? point dataset_kwargs.data_files at local files (recipes/tasks/boolq-local.yaml "
                                "shows how)" if offline else "check the data files and the templates' field names") from None
        if len(tasks) != 1:
            raise TaskError(f"{self.label} names {len(tasks)} tasks (a group or tag)", "name one task")
        task = next(iter(tasks.values()))
        if task.config.num_fewshot is None:  # as simple_evaluate: no num_fewshot means zero-shot
            task.set_config(key="num_fewshot", value=0)
        return task

    def _instances(self, which: str, upto: int) -> list[Example]:
        """Examples of the first `upto` documents of a split, built in order with a freshly seeded sampler."""
        have = self._built[which]
        if len(have) >= upto:
            return have
        task = self.lm_task
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
        docs = self.eval_docs if which == "eval" else self.train_docs
        with quiet():
            try:
                groups = self._requests_eval(upto) if which == "eval" else self._requests_train(upto)
            except TaskError:
                raise
            except Exception as err:  # noqa: BLE001 - lm-eval and datasets raise anything; one line for the user
                raise TaskError(f"{self.label}: lm-eval cannot build a document's prompt: {one_line(err)}",
                                "check the templates' field names") from None
            split_name = self.eval_split if which == "eval" else str(task.config.training_split)
            built = [self.scoring.example(task, i, docs[i], groups[i], split_name, self.label) for i in range(upto)]
        self._built[which] = built
        return built

    def _requests_eval(self, upto: int) -> list[list[Any]]:
        """lm-eval's own build_all_requests (as `lm_eval --limit upto`), grouped by document id."""
        self.lm_task.build_all_requests(limit=upto)
        groups: list[list[Any]] = [[] for _ in range(upto)]
        for inst in self.lm_task.instances:
            groups[inst.doc_id].append(inst)
        return [sorted(g, key=lambda inst: inst.idx) for g in groups]

    def _requests_train(self, upto: int) -> list[list[Any]]:
        """The same loop as build_all_requests over training documents; a document never shows as its own shot."""
        task, cfg = self.lm_task, self.lm_task.config
        test_split = cfg.test_split
        cfg.test_split = task.fewshot_cfg.split  # makes fewshot_context exclude the evaluated document
        try:
            out = []
            for doc_id, doc in enumerate(self.train_docs[:upto]):
                ctx = task.fewshot_context(doc, num_fewshot=cfg.num_fewshot or 0, system_instruction=None,
                                           apply_chat_template=False, fewshot_as_multiturn=False, chat_template=None,
                                           gen_prefix=task.doc_to_prefix(doc))
                inst = task.construct_requests(doc=doc, ctx=ctx, metadata=(cfg.task, doc_id, cfg.repeats),
                                               apply_chat_template=False, chat_template=None)
                out.append(sorted(inst if isinstance(inst, list) else [inst], key=lambda i: i.idx))
        finally:
            cfg.test_split = test_split
        return out

    # ---- the Task interface ----------------------------------------------------------------------
    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        if split not in ("discovery", "heldout"):
            raise TaskError(f"unknown split {split!r}", "use discovery or heldout")
        n_eval = len(self.eval_docs)
        if self.train_docs and split == "discovery":
            which, n_rows, note = "train", len(self.train_docs), ""
            picked = pick(n_rows, size if size is not None else self.default_sizes[0], seed, split)
        elif self.train_docs:
            which, n_rows, note = "eval", n_eval, ""
            picked = pick(n_rows, size, seed, split)
        else:
            which, n_rows = "eval", n_eval
            pool = self.default_sizes[0]
            if pool == 0:
                raise TaskError(f"{self.label}: {n_eval} document(s) are too few to carve discovery and held-out",
                                "add documents")
            order = list(range(n_eval))
            random.Random(f"carve:{seed}").shuffle(order)
            part = order[:pool] if split == "discovery" else order[pool:]
            want = len(part) if size is None else size
            if want > len(part):
                raise TaskError(f"requested {want} {split} examples but {self.label} has one split ({n_eval} "
                                f"documents), carved {pool} discovery / {n_eval - pool} held-out",
                                "lower the size")
            picked = sorted(part[:want])
            note = (f"no training split: discovery ({pool} documents) and held-out ({n_eval - pool}) carved without "
                    f"overlap from {self.eval_split} by a seeded shuffle (seed {seed})")
        built = self._instances(which, (max(picked) + 1) if picked else 0)
        split_name = self.eval_split if which == "eval" else str(self.lm_task.config.training_split)
        source = f"lm-eval task {self.task_name} ({self.label}) {split_name} documents"
        return Split(self.name, split, [built[i] for i in picked], source, note)

    def preview(self) -> Example:
        """The evaluated split's first document as lm-eval builds it (for `headedit tasks FILE`)."""
        return self._instances("eval", 1)[0]

    def check(self, example: Example, generated: str) -> bool:
        return self.scoring.correct(self.lm_task, example, generated, self.label)

    def filtered(self, example: Example, generated: str) -> Any:
        """The chosen filter pipeline's output for one generation (what the metric compares), for sample logs."""
        return self.scoring.filter(self.lm_task, example, generated)

    def source(self) -> TaskSource:
        from importlib import metadata

        files: tuple[dict[str, str], ...] = ()
        data: list[Path] = []
        kwargs = self.lm_task.config.dataset_kwargs
        if isinstance(kwargs, dict):
            data = local_files(kwargs.get("data_files"))
        if self.path is not None:
            files = tuple(file_entry(p) for p in definition_files(self.path))
        return TaskSource(
            "lm-eval", self.name, task_file=file_entry(self.path) if self.path is not None else None, files=files,
            data=tuple(file_entry(p) for p in data),
            details={"lm_eval_task": self.task_name, "output_type": self.lm_task.OUTPUT_TYPE, "metric": self.metric,
                     "filter": self.scoring.filter_name, "num_fewshot": self.lm_task.config.num_fewshot or 0,
                     "fewshot_seed": FEWSHOT_SEED, "eval_split": self.eval_split,
                     "training_split": self.lm_task.config.training_split if self.train_docs else None,
                     "dataset_path": self.lm_task.config.dataset_path if self.dataset_id else None,
                     "lm_eval_version": metadata.version("lm-eval")},
        )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "lm_eval_task": self.task_name, "output_type": self.lm_task.OUTPUT_TYPE,
                "metrics": self.scoring.available_metrics, "filters": self.scoring.available_filters,
                "filter": self.scoring.filter_name, "num_fewshot": self.lm_task.config.num_fewshot or 0,
                "eval_split": self.eval_split, "eval_documents": len(self.eval_docs),
                "training_split": self.lm_task.config.training_split if self.train_docs else None,
                "training_documents": len(self.train_docs), "default_sizes": list(self.default_sizes),
                "max_gen_toks": self.max_new_tokens if self.kind == "generate" else None,
                "until": list(self.stop) if self.kind == "generate" else None}

