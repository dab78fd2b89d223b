"""How an lm-eval task's metric becomes per-document correctness, decided by lm-eval's own code.

- multiple choice: which choice wins is what the engine computes (summed log-likelihood, divided by the choice's
  length for acc_norm / acc_bytes, as lm-eval divides). Which winners are *correct* is asked of lm-eval's
  `process_results`: for each choice k it gets log-likelihoods where k wins by far, and its metric says 0 or 1.
  So the gold index (an int, a choice's text, a template), `process_docs` and a custom `process_results` are all
  lm-eval's business; a document with no correct winner (a bad gold index) is never correct, as in lm-eval.
- loglikelihood (acc): lm-eval's `is_greedy`, i.e. every continuation token is the argmax: headedit's exact kind.
- generate_until: the greedy text goes through the chosen filter pipeline (`filter_list`, e.g. a regex and
  take_first) and then `process_results`; its metric must be 0 or 1 for every document.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from headedit.errors import TaskError
from headedit.tasks.base import Example, TaskKind

MC_NORMALIZE = {"acc": None, "acc_norm": "chars", "acc_bytes": "bytes"}
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HF backend default
FAR = -1e30  # a log-likelihood so low that any other choice wins, normalised or not


@dataclass
class Scoring:
    """The chosen metric and filter of one lm-eval task, and how its documents become examples."""

    output_type: str
    kind: TaskKind
    metric: str
    filter_name: str
    filter_index: int
    normalize: str | None = None  # None | "chars" | "bytes": acc_norm / acc_bytes division
    max_gen_toks: int = DEFAULT_MAX_GEN_TOKS
    until: tuple[str, ...] = ()
    repeats: int = 1
    mutual_info: bool = False  # acc_mutual_info in the metric list: lm-eval adds unconditional requests
    available_metrics: list[str] = field(default_factory=list)
    available_filters: list[str] = field(default_factory=list)

    # ---- documents -> examples -----------------------------------------------------------------
    def example(self, task: Any, doc_id: int, doc: dict[str, Any], instances: Sequence[Any], split: str,
                label: str) -> Example:
        meta: dict[str, Any] = {"doc": doc, "doc_id": doc_id, "split": split}
        where = f"{label}: {split} document {doc_id}"
        if self.kind == "choice":
            choices = task.doc_to_choice(doc)
            if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
                raise TaskError(f"{where}: doc_to_choice gave {type(choices).__name__} {str(choices)[:60]}, "
                                "not a list of strings", "make doc_to_choice a list of strings")
            conditional = instances[:len(choices)]
            contexts = {inst.arguments[0] for inst in conditional}
            if len(contexts) != 1:
                raise TaskError(f"{where} has one context per choice", "multiple-input tasks are not supported")
            context = next(iter(contexts))
            if not context:
                raise TaskError(f"{where} has an empty prompt", "check doc_to_text")
            if self.normalize:
                meta["choice_lengths"] = tuple(len(c) if self.normalize == "chars" else len(c.encode("utf-8"))
                                               for c in choices)
            return Example(doc_id, context, choices=tuple(inst.arguments[1] for inst in conditional),
                           label=self.winner(task, doc, len(choices), where), meta=meta)
        context = instances[0].arguments[0]
        if not isinstance(context, str) or not context:
            raise TaskError(f"{where} has an empty prompt", "check doc_to_text")
        if self.kind == "exact":
            return Example(doc_id, context, target=instances[0].arguments[1], meta=meta)
        meta["target"] = task.doc_to_target(doc)
        return Example(doc_id, context, meta=meta)

    def winner(self, task: Any, doc: dict[str, Any], n: int, where: str) -> int:
        """The choice lm-eval's process_results counts as correct when it wins (-1: none is)."""
        wins = []
        for k in range(n):
            results = [(0.0 if i == k else FAR, False) for i in range(n)]
            if self.mutual_info:
                results += [(0.0, False)] * n
            if self.value(task.process_results(doc, results), where):
                wins.append(k)
        if len(wins) > 1:
            raise TaskError(f"{where} has {len(wins)} correct choices (multiple targets)",
                            "headedit scores documents with one correct choice")
        return wins[0] if wins else -1

    def value(self, results: dict[str, Any], where: str) -> bool:
        got = results.get(self.metric)
        if isinstance(got, bool) or got in (0, 1):
            return bool(got)
        raise TaskError(f"{where}: metric {self.metric} gave {str(got)[:40]}, not 0 or 1",
                        "headedit needs a per-document correct/incorrect metric (acc, exact_match, ...)")

    # ---- generations -> correctness -----------------------------------------------------------
    def filter(self, task: Any, example: Example, generated: str) -> Any:
        """The filter pipeline's output for one document's greedy text (repeats are identical under greedy)."""
        ensemble = task._filters[self.filter_index]
        resps: Any = [[generated] * self.repeats]
        for make in ensemble.filters:
            resps = make().apply(resps, [example.meta["doc"]])
        return next(iter(resps))

    def correct(self, task: Any, example: Example, generated: str, label: str) -> bool:
        filtered = self.filter(task, example, generated)
        where = f"{label}: {example.meta.get('split')} document {example.index}"
        return self.value(task.process_results(example.meta["doc"], [filtered]), where)


def aggregation_name(task: Any, metric: str) -> str:
    """The name of a metric's aggregation (`mean` for per-document metrics)."""
    from lm_eval.api.registry import AGGREGATION_REGISTRY  # optional extra

    fn = task.aggregation().get(metric)
    for name, registered in AGGREGATION_REGISTRY.items():
        if registered is fn:
            return name
    return getattr(fn, "__name__", str(fn))


def choose_scoring(task: Any, pick: str | None, label: str) -> Scoring:
    """The metric (first of metric_list, or `pick`'s) and filter, refused where not per-document correctness."""
    output_type = str(task.OUTPUT_TYPE)
    if output_type == "loglikelihood_rolling":
        raise TaskError(f"{label}: output_type loglikelihood_rolling scores perplexity, a corpus-level metric",
                        "headedit needs per-document correctness (acc, acc_norm, exact_match, ...)")
    metrics = list(task._metric_fn_list)
    filters = [f.name for f in task._filters]
    want_metric, _, want_filter = (pick or "").partition(",")
    metric = want_metric or (metrics[0] if metrics else "")
    filter_name = want_filter or filters[0]
    if metric not in metrics:
        raise TaskError(f"{label} has no metric {metric!r}", "its metrics: " + (", ".join(metrics) or "none"))
    if filter_name not in filters:
        raise TaskError(f"{label} has no filter {filter_name!r}", "its filters: " + ", ".join(filters))
    agg = aggregation_name(task, metric)
    if agg != "mean":
        raise TaskError(f"{label}: metric {metric} is corpus-level (aggregation {agg})",
                        "headedit needs a per-document metric such as acc, acc_norm or exact_match; pick one with "
                        "FILE#METRIC")
    custom = callable(task.config.process_results)
    common: dict[str, Any] = {"output_type": output_type, "metric": metric, "filter_name": filter_name,
                                  "filter_index": filters.index(filter_name), "repeats": int(task.config.repeats or 1),
                                  "available_metrics": metrics, "available_filters": filters}
    if output_type == "multiple_choice":
        if getattr(task, "multiple_input", 0):
            raise TaskError(f"{label} puts each choice in its own context (multiple inputs)",
                            "headedit scores one context with one continuation per choice")
        if metric == "acc_mutual_info" or (metric not in MC_NORMALIZE and not custom):
            raise TaskError(f"{label}: metric {metric} is not decided by which choice wins",
                            "use acc, acc_norm or acc_bytes (FILE#acc_norm)")
        return Scoring(kind="choice", normalize=MC_NORMALIZE.get(metric),
                       mutual_info="acc_mutual_info" in metrics, **common)
    if output_type == "loglikelihood":
        if metric != "acc" or custom:
            raise TaskError(f"{label}: loglikelihood metric {metric} is not per-document greedy correctness",
                            "use metric acc (the continuation is the greedy one)")
        return Scoring(kind="exact", **common)
    if output_type == "generate_until":
        from lm_eval.models.utils import normalize_gen_kwargs  # optional extra

        kwargs = normalize_gen_kwargs(dict(task.config.generation_kwargs or {}), DEFAULT_MAX_GEN_TOKS)
        if kwargs.get("do_sample"):
            raise TaskError(f"{label} samples its generations (do_sample / temperature > 0)",
                            "headedit scores greedy generations: set do_sample: false")
        until = kwargs.get("until") or []
        return Scoring(kind="generate", max_gen_toks=int(kwargs["max_gen_toks"]),
                       until=tuple(str(u) for u in (until if isinstance(until, list) else [until])), **common)
    raise TaskError(f"{label}: output_type {output_type} is not supported", "use multiple_choice, loglikelihood "
                    "or generate_until")
