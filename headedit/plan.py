"""Cost plan: what a recipe will cost (evaluations, tokens, FLOPs, memory, time) before any forward pass.

Everything comes from the model's config.json and the task's prompts, so a user can size a run on a laptop
before renting a GPU. The numbers are upper bounds of the plain work: the search counts every expansion
the beam could try, the single screen counts every head over the whole split (the early stop only lowers
it), and padding is not counted. Time = FLOPs / (device FLOP/s x utilisation); see `DEVICES`.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from headedit.errors import HeadeditError, ModelLoadError
from headedit.model.heads import HeadLayout
from headedit.recipe import Recipe

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
AUTO_BATCH = 8  # batch size assumed for memory when the recipe says "auto"
ASSUMED_TOKENS = 256  # tokens per sequence when neither tokenizer nor task data is available
STATS_SAMPLE = 256  # examples tokenized per task to measure lengths (the mean scales to the split)
ALL_HEADS_ADDITIONS = 2  # first additions drawn from every head (as headedit.discovery.search does)

# Dense peak FLOP/s per dtype class and the share of it a batched inference forward reaches.
# GPU peaks are the vendors' dense tensor-core figures (A100 312 bf16 / 19.5 fp32; H100 and H200 SXM
# 989 bf16 / 67 fp32). UTILISATION 0.35 is a typical model-FLOPs utilisation of batched prompt scoring
# with short sequences (kernel launches, attention, norms and padding eat the rest).
# `cpu` is measured on this machine (`measure_cpu_flops`: a short torch matmul loop on the model's MLP shape)
# and scaled by CPU_UTILISATION, calibrated on 2 busy cores against timed forwards of small random Llamas
# (forwards reached 0.25-0.45 of the matmul FLOP/s at hidden 256-512 and 0.96 at hidden 2048: 0.4 is right
# for small models and errs slow, by up to ~2.4x, for 3B ones; tests/test_plan.py checks 2x on a small one);
# `cpu-nominal` is a conservative constant for a few-core CPU in float32.
DEVICES: dict[str, dict[str, float]] = {
    "a100": {"half": 312e12, "float32": 19.5e12},
    "h100": {"half": 989e12, "float32": 67e12},
    "h200": {"half": 989e12, "float32": 67e12},
    "cpu-nominal": {"half": 25e9, "float32": 50e9},
}
UTILISATION = 0.35
CPU_UTILISATION = 0.4
DEFAULT_DEVICES = ("cpu", "a100", "h100", "h200")


# ---- model ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelCost:
    """Parameter counts from config shapes (norm weights included, small extras such as q/k norms not)."""

    layout: HeadLayout
    params: int  # everything stored: what the weights take in memory
    matmul_params: int  # weights multiplied per token: all but the input embedding (lm_head counted even if tied)
    vocab_size: int
    intermediate_size: int
    dtype: str  # the checkpoint's own dtype (config torch_dtype/dtype), used for dtype = "auto"

    def forward_flops(self, lengths: Sequence[float] | float, n: float = 1.0) -> float:
        """FLOPs of `n` forwards of sequences of these lengths: 2*matmul_params per token + causal attention."""
        lengths = [lengths] if isinstance(lengths, (int, float)) else list(lengths)
        lay = self.layout
        attn = 2 * lay.attention_width  # QK^T and AV over the layers with heads: 2 mults x ctx per token
        per = sum(2 * self.matmul_params * s + attn * s * (s + 1) for s in lengths)
        return per * n


def model_cost(config: Mapping[str, Any]) -> ModelCost:
    """Count parameters of a Llama-style decoder from its config.json."""
    layout = HeadLayout.from_config(config)
    cfg = config["text_config"] if config.get("num_attention_heads") is None and config.get("text_config") else config
    try:
        vocab = int(cfg["vocab_size"])
        inter = int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        raise ModelLoadError("config.json lacks vocab_size/intermediate_size", "check config.json") from None
    h = layout.hidden_size
    # query and KV widths summed over the layers with heads (the geometry knows per-layer heads and widths)
    q = sum(lay.num_heads * lay.head_width for lay in layout.attention_layers)
    kv = sum(lay.num_kv_heads * lay.head_width for lay in layout.attention_layers)
    full = _with_defaults(cfg)  # keys a config.json leaves out take the transformers class defaults
    bias = bool(full.get("attention_bias", False)) or layout.model_type == "qwen2"  # qwen2 always has q/k/v bias
    attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if bias else 0)
    mlp = 3 * h * inter + ((2 * inter + h) if full.get("mlp_bias") else 0)
    body = attn + layout.num_layers * (mlp + 2 * h) + h  # attention of every head layer, MLPs, norms, final norm
    embed = vocab * h
    tied = bool(full.get("tie_word_embeddings", False))
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    return ModelCost(layout, embed + body + (0 if tied else embed), body + embed, vocab, inter,
                     dtype if dtype in BYTES else "float32")


def _with_defaults(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """config.json merged over its transformers config class's defaults (e.g. SmolLM3 ties embeddings by default)."""
    merged = dict(cfg)
    try:
        from transformers import CONFIG_MAPPING

        obj = CONFIG_MAPPING[str(cfg.get("model_type"))](**cfg)
        for key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            if key not in merged and hasattr(obj, key):
                merged[key] = getattr(obj, key)
    except Exception:  # unknown model_type or a config the class rejects: the file's own keys stand
        pass
    return merged


def read_model_config(model_id: str, revision: str | None = None, model_path: str | Path | None = None,
                      ) -> tuple[dict[str, Any], Path | None, str]:
    """(config, local model folder or None, description). `model_path` may be a folder or a config.json file."""
    # lazy: torch-backed, loaded only when a model is
    from headedit.model.loading import resolve_model, source_config

    if model_path is not None:
        path = Path(model_path).expanduser()
        if path.is_file() and path.suffix.lower() != ".gguf":
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ModelLoadError(f"{path.name} is not valid JSON ({err})", "point --model at a config.json") from None
            if not isinstance(config, dict):
                raise ModelLoadError(f"{path.name} is not a JSON object", "point --model at a config.json")
            return config, path.parent, f"{path}"
        source = resolve_model(str(path), None, weights=False)
    else:
        source = resolve_model(model_id, revision, weights=False)
    return source_config(source), source.path, str(source.id)


# ---- tokens -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenStats:
    """Lengths of the one sequence the engine runs per example (context + packed endings, or + draft)."""

    task: str
    mean: float
    mean_sq: float  # for the attention term
    max: int
    sampled: int
    source: str  # "tokenizer" | "chars/4" | "assumed"
    note: str = ""

    def flops(self, cost: ModelCost, n_examples: int) -> float:
        # sum over examples of 2*P*s + attn*s*(s+1) = n*(2P*mean + attn*(mean_sq + mean))
        lay = cost.layout
        attn = 2 * lay.attention_width
        return n_examples * (2 * cost.matmul_params * self.mean + attn * (self.mean_sq + self.mean))


def load_tokenizer(path: Path | None) -> Any:
    """The model's tokenizer from its local folder, or None when the folder has no usable tokenizer files."""
    if path is None or not path.is_dir():
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the library never prints; a failed load is reported in the plan's notes
    try:
        # lazy: only GGUF sources need the GGUF reader
        from headedit.model.gguf_source import find_gguf, gguf_tokenizer

        gguf = find_gguf(path)
        if gguf is not None:  # a GGUF's tokenizer lives in the file (cached after the first read)
            return gguf_tokenizer(gguf)
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception:  # missing or partial tokenizer files: fall back to characters / 4
        return None
    finally:
        hf_logging.set_verbosity(level)


def token_stats(task_name: str, recipe: Recipe, tokenizer: Any, size: int) -> TokenStats:
    """Measure sequence lengths on up to STATS_SAMPLE discovery examples of `task_name`."""
    # lazy: the task registry (and the task files it may build) loads on first use
    from headedit.tasks import get_task

    task = get_task(task_name)
    try:
        split = task.load("discovery", min(size, STATS_SAMPLE), recipe.task.seed,
                          Path(recipe.task.data_dir) if recipe.task.data_dir else None)
        examples = list(split.examples)
    except HeadeditError as err:
        s = float(ASSUMED_TOKENS + (task.max_new_tokens if task.kind == "generate" else 0))
        return TokenStats(task_name, s, s * s, int(s), 0, "assumed",
                          f"task data unavailable ({err.message}); assumed {ASSUMED_TOKENS} prompt tokens")
    if not examples:
        return TokenStats(task_name, 1.0, 1.0, 1, 0, "assumed", "the task returned no examples")
    lengths: list[int] = []
    source, note = "tokenizer", ""
    if tokenizer is not None:
        try:
            # lazy: torch-backed, loaded only when a model is
            from headedit.engine.batch import plan_example

            kwargs = dict(recipe.model.chat_template_kwargs)
            for ex in examples:
                p, _ = plan_example(task, ex, tokenizer, recipe.task.chat, kwargs, tokenizer.eos_token_id)
                lengths.append(len(p.tokens) + (task.max_new_tokens if task.kind == "generate" else 0))
        except Exception as err:  # e.g. chat = true but the tokenizer has no chat template
            lengths, note = [], f"tokenizer failed ({type(err).__name__}); "
    if not lengths:
        source = "chars/4"
        note += "no tokenizer: lengths are characters / 4" + (" (chat template not counted)" if recipe.task.chat else "")
        for ex in examples:
            chars = len(ex.prompt) + len(ex.target or "") + sum(len(c) for c in ex.choices)
            extra = task.max_new_tokens if task.kind == "generate" else 0
            lengths.append(max(1, math.ceil(chars / 4)) + extra)
    if task.kind == "generate":
        note = (note + "; " if note else "") + f"generated: counts {task.max_new_tokens} draft tokens per example"
    n = len(lengths)
    return TokenStats(task_name, sum(lengths) / n, sum(s * s for s in lengths) / n, max(lengths), n, source, note)


# ---- the plan -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    name: str
    evaluations: int  # ablation sets scored (each a pass over the split), or passes for the gradient
    split: str
    n_examples: int
    tokens: float  # tokens processed in all
    flops: float
    note: str = ""


@dataclass(frozen=True)
class Plan:
    recipe: str
    model: str
    layout: dict[str, Any]
    params: int
    dtype: str
    batch_size: int
    stages: tuple[Stage, ...]
    memory: dict[str, int]  # bytes
    tokens: tuple[TokenStats, ...]
    notes: tuple[str, ...] = ()
    flops_per_s: dict[str, float] = field(default_factory=dict)  # device -> achieved FLOP/s used for time

    @property
    def flops(self) -> float:
        return sum(s.flops for s in self.stages)

    def seconds(self, device: str) -> float:
        return self.flops / self.flops_per_s[device]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["flops"] = self.flops
        out["seconds"] = {dev: self.seconds(dev) for dev in self.flops_per_s}
        return out


def search_evaluations(recipe: Recipe, total_heads: int) -> int:
    """Upper bound on new sets the joint search scores (mirrors headedit.discovery.search.joint_search)."""
    d = recipe.discovery
    k = min(d.candidates, total_heads)

    def pool(size: int) -> int:
        return total_heads if d.first_additions_all_heads and size <= ALL_HEADS_ADDITIONS else k

    count, start, beams = 0, 1, 1
    if d.search == "exhaustive":
        cap = min(d.exhaustive_size, d.max_heads, k)
        count = sum(math.comb(k, s) for s in range(1, cap + 1))
        if d.screen == "single":
            count -= k  # singles are already in the journal
        start, beams = cap + 1, min(d.beam, math.comb(k, cap))
    for size in range(start, d.max_heads + 1):
        # a base drawn from all heads may share no head with the candidate pool: then all of it is new
        mixed = d.first_additions_all_heads and size > ALL_HEADS_ADDITIONS
        new = beams * max(0, pool(size) - (0 if mixed else size - 1))
        if size == 1 and d.screen == "single":
            new = 0  # every single set is in the journal from the screen
        count += new
        beams = min(d.beam, math.comb(pool(size), size))
    return count


def make_plan(recipe: Recipe, config: Mapping[str, Any], *, tokenizer: Any = None, devices: Mapping[str, float],
              model_name: str | None = None, token_overrides: Mapping[str, TokenStats] | None = None) -> Plan:
    """Count the work of a recipe on a model. `devices` maps a name to achieved FLOP/s (see `device_flops`)."""
    cost = model_cost(config)
    lay = cost.layout
    dtype = cost.dtype if recipe.model.dtype == "auto" else recipe.model.dtype
    nbytes = BYTES[dtype]
    batch = AUTO_BATCH if recipe.model.batch_size == "auto" else int(recipe.model.batch_size)
    d, t = recipe.discovery, recipe.task
    overrides = dict(token_overrides or {})

    def stats(name: str, size: int) -> TokenStats:
        if name not in overrides:
            overrides[name] = token_stats(name, recipe, tokenizer, size)
        return overrides[name]

    main = stats(t.name, t.discovery)
    per_eval = main.flops(cost, t.discovery)
    per_tokens = main.mean * t.discovery
    total = lay.total_heads
    stages: list[Stage] = []
    if d.screen == "single":
        n = total + 1
        early = f"; early stop (alpha {d.early_stop_alpha}) drops harmful heads partway" if d.early_stop else ""
        stages.append(Stage("screen:single", n, "discovery", t.discovery, n * per_tokens, n * per_eval,
                            f"{lay.num_layers}x{lay.num_heads} heads + intact; prefix reuse skips the layers below "
                            f"each head (about {100 * (lay.num_layers - 1) / (2 * lay.num_layers):.0f}% of layer work)"
                            + early))
    elif d.screen == "compressed":
        n = d.compressed_set_count(total) + 1
        stages.append(Stage("screen:compressed", n, "discovery", t.discovery, n * per_tokens, n * per_eval,
                            f"{n - 1} knockout sets of {d.compressed_fraction:.0%} of heads + intact"))
    else:
        stages.append(Stage("screen:gradient", 2, "discovery", t.discovery, 2 * per_tokens, 4 * per_eval,
                            "intact scoring + one forward and backward pass (backward ~2x forward)"))
    n = search_evaluations(recipe, total)
    stages.append(Stage(f"search:{d.search}", n, "discovery", t.discovery, n * per_tokens, n * per_eval,
                        f"upper bound: {min(d.candidates, total)} candidates, up to {d.max_heads} heads, beam {d.beam}"
                        + (f", first {ALL_HEADS_ADDITIONS} additions over all {total} heads"
                           if d.first_additions_all_heads else "")))
    val_flops = 2 * main.flops(cost, t.heldout)
    val_tokens = 2 * main.mean * t.heldout
    notes = []
    for side in recipe.validation.side_tasks:
        # lazy: the task registry (and the task files it may build) loads on first use
        from headedit.tasks import get_task

        held = get_task(side).default_sizes[1]
        st = stats(side, held)
        val_flops += 2 * st.flops(cost, held)
        val_tokens += 2 * st.mean * held
        notes.append(f"side task {side}: {held} held-out examples (its default size)")
    stages.append(Stage("validate", 2 + 2 * len(recipe.validation.side_tasks), "heldout", t.heldout, val_tokens,
                        val_flops, "intact and edited model on the held-out split and each side task"))
    seq = main.max
    memory = {
        "weights": cost.params * nbytes,
        # one decoder layer live at a time: residual, q/k/v/o and MLP activations, plus float32 logits
        "activations": batch * seq * (4 * lay.hidden_size + 3 * cost.intermediate_size) * nbytes
        + batch * seq * cost.vocab_size * 4,
        "prefix_cache": int(t.discovery * main.mean * lay.hidden_size * lay.num_layers * nbytes),
    }
    if d.screen == "gradient":
        memory["backward_activations"] = batch * seq * lay.num_layers * (8 * lay.hidden_size
                                                                        + 3 * cost.intermediate_size) * nbytes
    notes.append("prefix cache: the engine keeps at most its prefix_cache_bytes (1 GiB by default, LRU) and "
                 "recomputes the rest")
    if recipe.model.batch_size == "auto":
        notes.append(f"batch size auto: memory assumes {AUTO_BATCH}")
    notes.append("held-out lengths assumed equal to discovery lengths; padding not counted")
    return Plan(recipe.name, model_name or recipe.model.id, lay.to_dict(), cost.params, dtype, batch, tuple(stages),
                memory, tuple(overrides.values()), tuple(notes), dict(devices))


def plan_dtype(recipe: Recipe, config: Mapping[str, Any]) -> str:
    """The dtype the run will compute in: the recipe's, or the checkpoint's for "auto"."""
    return model_cost(config).dtype if recipe.model.dtype == "auto" else recipe.model.dtype


# ---- devices ------------------------------------------------------------------------------------
def cpu_matmul_shape(config: Mapping[str, Any] | None) -> tuple[int, int, int]:
    """The calibration matmul: a 512-token batch through the model's MLP up-projection (capped at 2048x2048)."""
    if config is None:
        return (512, 512, 512)
    cost = model_cost(config)
    return (512, min(cost.layout.hidden_size, 2048), min(cost.intermediate_size, 2048))


def measure_cpu_flops(dtype: str = "float32", shape: tuple[int, int, int] = (512, 512, 512),
                      seconds: float = 0.3) -> float:
    """Achieved FLOP/s of this machine's CPU on a torch matmul of `shape` (m, k, n): the kernels a forward uses."""
    import torch

    m, k, n = shape
    tdtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(tdtype)
    b = torch.randn(k, n, generator=gen).to(tdtype)
    a[:64] @ b  # warm-up
    reps, start = 0, time.perf_counter()
    while True:
        a @ b
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and reps >= 2:
            return 2 * m * k * n * reps / elapsed


def device_flops(spec: str, dtype: str, config: Mapping[str, Any] | None = None) -> tuple[str, float]:
    """(name, achieved FLOP/s) for a preset name or a number of FLOP/s (taken as achieved, no utilisation).

    `cpu` measures this machine on the model's own matmul shape (`cpu_matmul_shape(config)`).
    """
    key = spec.strip().lower()
    if key == "cpu":
        return "cpu", measure_cpu_flops(dtype, cpu_matmul_shape(config)) * CPU_UTILISATION
    if key in DEVICES:
        peaks = DEVICES[key]
        peak = peaks["float32"] if dtype == "float32" else peaks["half"]
        return key, peak * (1.0 if key == "cpu-nominal" else UTILISATION)
    try:
        value = float(key)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise HeadeditError(f"--device-flops {spec!r} is neither a preset nor a positive number",
                            "presets: cpu (measured), " + ", ".join(DEVICES) + "; or FLOP/s such as 2e14")
    return f"{value:.3g} FLOP/s", value
