"""Recipes: one TOML file that says everything a run needs, validated once at the boundary.

Every problem becomes a one-line `RecipeError` naming the field in dotted form (`discovery.screen`) and what is
allowed, so nothing past `load_recipe` ever has to re-check a recipe. Sizes larger than the task's data can only
be checked when the task loads its split (the task raises `TaskError` then); everything else is checked here.
Relative paths (`task.data_dir`, `export.out`) are kept as written and resolve against the working directory.
"""
from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Mapping

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from headedit.errors import RecipeError
from headedit.recipe_fields import (
    MAX_SIZE,
    _bool,
    _choice,
    _Ctx,
    _fail,
    _float_range,
    _get,
    _gguf_name,
    _int_range,
    _max_memory,
    _no_unknown,
    _pattern,
    _positive,
    _positive_or_auto,
    _section,
    _string,
    _string_list,
    _task_fields,
    _task_names,
)

DTYPES = ("auto", "float32", "bfloat16", "float16")
SCREENS = ("single", "compressed", "gradient")
SEARCHES = ("greedy", "exhaustive")
OBJECTIVES = ("accuracy", "margin", "logprob")  # headedit/discovery/objective.py defines them
DIRECTIONS = ("improve", "remove")  # headedit/discovery/direction.py: what "remove" searches for
DEMO_MODEL_ID = "headedit:demo"  # resolved by the CLI to the checkpoint committed in headedit/demo/model
MAX_RECIPE_BYTES = 2**20  # a recipe is a few hundred bytes; read at most this much
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda|cuda:\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


# ---- schema -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    id: str  # hub id, local folder, or "headedit:demo"
    revision: str | None = None  # hub branch, tag or commit; None = the default branch
    dtype: str = "auto"  # auto = the checkpoint's own torch_dtype
    device: str = "auto"  # auto = cuda if available, else mps, else cpu
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    trust_remote_code: bool = False
    batch_size: int | Literal["auto"] = "auto"
    max_memory: Mapping[str, str] | None = None  # {"0": "70GiB", "cpu": "200GiB"}: spread over devices (device_map)
    gguf_file: str | None = None  # which .gguf of a folder holding several


@dataclass(frozen=True)
class TaskSpec:
    name: str
    discovery: int = 2000  # examples used to screen and search
    heldout: int = 1000  # examples used only by validation
    seed: int = 0
    data_dir: str | None = None  # None = $HEADEDIT_DATA_DIR, then the hub
    chat: bool = False  # format prompts through the tokenizer's chat template
    # Your own task (headedit/tasks/): an lm-eval registry task (name = "lm-eval:<lm_eval>"), optionally found in
    # include_path; or the JSONL/CSV shortcut (data, prompt, and choices + label or target), registered as name.
    lm_eval: str | None = None
    include_path: str | None = None
    data: str | None = None
    prompt: str | None = None
    choices: tuple[str, ...] | str | None = None  # templates, or the field holding each row's list
    label: str | None = None
    target: str | None = None


@dataclass(frozen=True)
class DiscoverySpec:
    screen: str = "single"
    candidates: int = 16  # top-k heads of the screen that the joint search may combine
    max_heads: int = 6
    search: str = "greedy"
    beam: int = 2
    min_gain: float = 0.0  # discovery-accuracy points a step must add over the current best; 0 = no floor
    exhaustive_size: int = 2  # exhaustive search: every subset of the candidates up to this size
    early_stop: bool = True
    early_stop_alpha: float = 0.01
    compressed_sets: int | Literal["auto"] = "auto"
    compressed_fraction: float = 0.05  # share of all heads knocked out by each compressed set
    first_additions_all_heads: bool = False
    seed: int = 0
    objective: str = "margin"  # what screens, early stop and search rank and test by (docs/discovery.md)
    alpha: float = 0.05  # a search step needs p < alpha / (sets it was chosen among); 1 = no test
    screen_rows: int = 0  # > 0: the screen uses the first rows, the search the rest (a smaller multiplicity)
    # remove: maximise the target's drop while every retain task (None = validation.side_tasks) falls at most
    # retain_tolerance accuracy points on its own discovery split (headedit/discovery/direction.py)
    direction: str = "improve"
    retain: tuple[str, ...] | None = None
    retain_tolerance: float = 2.0

    def compressed_set_count(self, total_heads: int) -> int:
        """Sets the compressed screen evaluates; `auto` = half the heads, at least 32 (plan and screen share this)."""
        if self.compressed_sets != "auto":
            return int(self.compressed_sets)
        return max(32, math.ceil(total_heads / 2))


@dataclass(frozen=True)
class ValidationSpec:
    side_tasks: tuple[str, ...] = ()
    bootstrap: int = 10_000  # paired bootstrap resamples for the gain's interval
    alpha: float = 0.05  # 1 - confidence of the interval; also the McNemar threshold for "gain held"


@dataclass(frozen=True)
class ExportSpec:
    out: str = ""  # default exports/<name>
    repo_id: str | None = None
    private: bool = True


@dataclass(frozen=True)
class Recipe:
    name: str
    model: ModelSpec
    task: TaskSpec
    discovery: DiscoverySpec = field(default_factory=DiscoverySpec)
    validation: ValidationSpec = field(default_factory=ValidationSpec)
    export: ExportSpec = field(default_factory=ExportSpec)
    source_text: str = field(default="", repr=False, compare=False)  # verbatim, for run folders and cards
    path: Path | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/TOML-ready values of every field (defaults filled in); parse_recipe of it gives this recipe."""
        out: dict[str, Any] = {"name": self.name}
        for section in ("model", "task", "discovery", "validation", "export"):
            spec = getattr(self, section)
            values = {f.name: getattr(spec, f.name) for f in fields(spec)}
            out[section] = {k: _plain(v) for k, v in values.items() if v is not None}
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---- parsing ----------------------------------------------------------------------------------
TOP_KEYS = ("name", "model", "task", "discovery", "validation", "export")
MODEL_KEYS = ("id", "revision", "dtype", "device", "chat_template_kwargs", "trust_remote_code", "batch_size",
              "max_memory", "gguf_file")
TASK_KEYS = ("name", "discovery", "heldout", "seed", "data_dir", "chat", "lm_eval", "include_path", "data", "prompt",
             "choices", "label", "target")
DISCOVERY_KEYS = tuple(f.name for f in fields(DiscoverySpec))
VALIDATION_KEYS = ("side_tasks", "bootstrap", "alpha")
EXPORT_KEYS = ("out", "repo_id", "private")



def parse_recipe(text: str, path: str | Path | None = None, *, check_tasks: bool = True) -> Recipe:
    """Parse and validate recipe text; `check_tasks=False` skips the task registry (schema-only checks)."""
    path = Path(path) if path is not None else None
    ctx = _Ctx(path)
    if not isinstance(text, str):
        raise RecipeError(f"{ctx.where}: recipe text must be a string", "pass the file's text")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        msg = str(err).replace("\n", " ")
        if "line" not in msg:
            line = text.count("\n", 0, getattr(err, "pos", 0) or 0) + 1
            msg += f" (at line {line})"
        raise RecipeError(f"{ctx.where}: not valid TOML: {msg}", "fix the TOML syntax at that line") from None
    except RecursionError:
        raise RecipeError(f"{ctx.where}: not valid TOML: nested too deeply", "flatten the arrays or tables") from None
    _no_unknown(ctx, raw, "", TOP_KEYS)
    name = _get(ctx, raw, "name", "", _pattern(_NAME), "a name of letters, digits, '.', '_' or '-' (max 96)",
                example='"smollm3-arithmetic"')

    m = _section(ctx, raw, "model", MODEL_KEYS, required=True)
    p = "model."
    kwargs = _get(ctx, m, "chat_template_kwargs", p, lambda v: dict(v) if isinstance(v, dict) else _fail(),
                  "a table", {}, example="{ enable_thinking = false }")
    model = ModelSpec(
        id=_get(ctx, m, "id", p, _string, "a hub id or local folder (string)", example='"HuggingFaceTB/SmolLM3-3B"'),
        revision=_get(ctx, m, "revision", p, _string, "a branch, tag or commit (string)", None, example='"main"'),
        dtype=_get(ctx, m, "dtype", p, _choice(DTYPES), "one of " + "|".join(DTYPES), "auto", example='"bfloat16"'),
        device=_get(ctx, m, "device", p, _pattern(_DEVICE), "one of auto|cpu|cuda|cuda:N|mps", "auto",
                    example='"cuda"'),
        chat_template_kwargs=MappingProxyType(kwargs),
        trust_remote_code=_get(ctx, m, "trust_remote_code", p, _bool, "true or false", False, example="false"),
        batch_size=_get(ctx, m, "batch_size", p, _positive_or_auto, f'"auto" or an integer 1..{MAX_SIZE}', "auto",
                        example="16"),
        max_memory=_get(ctx, m, "max_memory", p, _max_memory, 'a table of GPU index or "cpu" = size like "70GiB"',
                        None, example='{ 0 = "70GiB", 1 = "70GiB" }'),
        gguf_file=_get(ctx, m, "gguf_file", p, _gguf_name, "a .gguf file name inside model.id's folder", None,
                       example='"model.Q4_K_M.gguf"'),
    )
    if model.max_memory is not None and model.device in ("cpu", "mps"):
        raise ctx.fail("model.max_memory", f"needs CUDA GPUs, but model.device is {model.device!r}",
                       'set device = "auto" or remove max_memory')

    t = _section(ctx, raw, "task", TASK_KEYS, required=True)
    p = "task."
    task_name, task_obj, task_fields = _task_fields(ctx, t, check_tasks)
    default_sizes = getattr(task_obj, "default_sizes", (2000, 1000))
    sizes = f"an integer 1..{MAX_SIZE}"
    task = TaskSpec(
        name=task_name,
        discovery=_get(ctx, t, "discovery", p, _positive, sizes, default_sizes[0], example="2000"),
        heldout=_get(ctx, t, "heldout", p, _positive, sizes, default_sizes[1], example="1000"),
        seed=_get(ctx, t, "seed", p, _int_range(0, 2**63 - 1), "a non-negative integer", 0, example="0"),
        data_dir=_get(ctx, t, "data_dir", p, _string, "a folder path (string)", None, example='"data/hf"'),
        chat=_get(ctx, t, "chat", p, _bool, "true or false", False, example="true"),
        **task_fields,
    )
    if model.chat_template_kwargs and not task.chat:
        raise ctx.fail("model.chat_template_kwargs", "has no effect without task.chat = true",
                       "set chat = true under [task] or remove chat_template_kwargs")

    d = _section(ctx, raw, "discovery", DISCOVERY_KEYS, required=False)
    p = "discovery."
    dd = DiscoverySpec()
    discovery = DiscoverySpec(
        screen=_get(ctx, d, "screen", p, _choice(SCREENS), "one of " + "|".join(SCREENS), dd.screen, '"single"'),
        candidates=_get(ctx, d, "candidates", p, _positive, sizes, dd.candidates, "16"),
        max_heads=_get(ctx, d, "max_heads", p, _positive, sizes, dd.max_heads, "6"),
        search=_get(ctx, d, "search", p, _choice(SEARCHES), "one of " + "|".join(SEARCHES), dd.search, '"greedy"'),
        beam=_get(ctx, d, "beam", p, _positive, sizes, dd.beam, "2"),
        min_gain=_get(ctx, d, "min_gain", p, _float_range(0.0, 100.0), "points in 0..100", dd.min_gain, "0.1"),
        exhaustive_size=_get(ctx, d, "exhaustive_size", p, _int_range(1, 8), "an integer 1..8", dd.exhaustive_size,
                             "2"),
        early_stop=_get(ctx, d, "early_stop", p, _bool, "true or false", dd.early_stop, "true"),
        early_stop_alpha=_get(ctx, d, "early_stop_alpha", p, _float_range(0.0, 1.0, True, True),
                              "a probability strictly between 0 and 1", dd.early_stop_alpha, "0.01"),
        compressed_sets=_get(ctx, d, "compressed_sets", p, _positive_or_auto, f'"auto" or {sizes}',
                             dd.compressed_sets, "256"),
        compressed_fraction=_get(ctx, d, "compressed_fraction", p, _float_range(0.0, 1.0, True, True),
                                 "a fraction strictly between 0 and 1", dd.compressed_fraction, "0.05"),
        first_additions_all_heads=_get(ctx, d, "first_additions_all_heads", p, _bool, "true or false",
                                       dd.first_additions_all_heads, "false"),
        seed=_get(ctx, d, "seed", p, _int_range(0, 2**63 - 1), "a non-negative integer", dd.seed, "0"),
        objective=_get(ctx, d, "objective", p, _choice(OBJECTIVES), "one of " + "|".join(OBJECTIVES), dd.objective,
                       '"margin"'),
        alpha=_get(ctx, d, "alpha", p, _float_range(0.0, 1.0, lo_open=True), "a probability in (0, 1]", dd.alpha,
                   "0.05"),
        screen_rows=_get(ctx, d, "screen_rows", p, _int_range(0, MAX_SIZE), f"an integer 0..{MAX_SIZE}",
                         dd.screen_rows, "200"),
        direction=_get(ctx, d, "direction", p, _choice(DIRECTIONS), "one of " + "|".join(DIRECTIONS), dd.direction,
                       '"remove"'),
        retain=_get(ctx, d, "retain", p, lambda v: tuple(_string_list(v)), "an array of task names", None,
                    '["copy-second"]'),
        retain_tolerance=_get(ctx, d, "retain_tolerance", p, _float_range(0.0, 100.0), "points in 0..100",
                              dd.retain_tolerance, "2.0"),
    )
    if discovery.screen_rows and discovery.screen_rows >= task.discovery:
        raise ctx.fail("discovery.screen_rows", f"({discovery.screen_rows}) must be below task.discovery "
                       f"({task.discovery})", "the search needs rows of its own: lower screen_rows or raise "
                       "task.discovery (0 = screen and search share every row)")
    if discovery.max_heads > discovery.candidates:
        raise ctx.fail("discovery.max_heads", f"({discovery.max_heads}) exceeds discovery.candidates "
                       f"({discovery.candidates})", "a selected set is drawn from the candidates: lower it or raise candidates")
    if discovery.search == "exhaustive" and discovery.exhaustive_size > discovery.candidates:
        raise ctx.fail("discovery.exhaustive_size", f"({discovery.exhaustive_size}) exceeds discovery.candidates "
                       f"({discovery.candidates})", "subsets are drawn from the candidates: lower it or raise candidates")

    v = _section(ctx, raw, "validation", VALIDATION_KEYS, required=False)
    p = "validation."
    side = _get(ctx, v, "side_tasks", p, _string_list, "an array of task names", [], example='["boolq"]')
    for i, side_name in enumerate(side):
        _task_names(ctx, f"validation.side_tasks[{i}]", side_name, check_tasks)
    if len(set(side)) != len(side):
        raise ctx.fail("validation.side_tasks", "lists a task twice", "name each side task once")
    validation = ValidationSpec(
        side_tasks=tuple(side),
        bootstrap=_get(ctx, v, "bootstrap", p, _int_range(100, 1_000_000), "an integer 100..1000000", 10_000, "10000"),
        alpha=_get(ctx, v, "alpha", p, _float_range(0.0, 0.5, True, False), "a probability in (0, 0.5]", 0.05, "0.05"),
    )

    _check_direction(ctx, discovery, validation, task.name, check_tasks)

    e = _section(ctx, raw, "export", EXPORT_KEYS, required=False)
    p = "export."
    export = ExportSpec(
        out=_get(ctx, e, "out", p, _string, "a folder path (string)", f"exports/{name}", f'"exports/{name}"'),
        repo_id=_get(ctx, e, "repo_id", p, _pattern(_REPO_ID), "a hub repo id owner/name", None,
                     '"your-name/model-headedit"'),
        private=_get(ctx, e, "private", p, _bool, "true or false", True, "true"),
    )
    return Recipe(name, model, task, discovery, validation, export, source_text=text, path=path)



def _check_direction(ctx: _Ctx, d: DiscoverySpec, v: ValidationSpec, target: str, check_tasks: bool) -> None:
    """discovery.retain / retain_tolerance belong to direction = "remove", which needs a task to retain."""
    if d.direction != "remove":
        for key, given in (("retain", d.retain is not None), ("retain_tolerance", d.retain_tolerance != 2.0)):
            if given:
                raise ctx.fail(f"discovery.{key}", 'applies only to direction = "remove"',
                               f'add direction = "remove" under [discovery], or remove {key}')
        return
    retain = d.retain if d.retain is not None else v.side_tasks
    key = "discovery.retain" if d.retain is not None else "validation.side_tasks"
    if not retain:
        raise ctx.fail(key, 'is empty, but direction = "remove" needs a task to retain (to show the removal is '
                       "selective)", 'name one under [discovery]: retain = ["other-task"]')
    if len(set(retain)) != len(retain):
        raise ctx.fail(key, "lists a task twice", "name each retained task once")
    if target in retain:
        raise ctx.fail(key, f"names the task being removed ({target!r})", "retain other tasks than task.name")
    for i, name in enumerate(retain if d.retain is not None else ()):
        _task_names(ctx, f"discovery.retain[{i}]", name, check_tasks)




def load_recipe(path: str | Path, *, check_tasks: bool = True) -> Recipe:
    """Read a recipe file (UTF-8 TOML) and validate it; the verbatim text is kept in `source_text`."""
    path = Path(path)
    try:
        info = os.stat(path)  # before opening: a FIFO would block the open, /dev/zero never ends
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(info.st_mode):
            raise RecipeError(f"recipe {path} is not a regular file (a FIFO or device)", "name a .toml file")
        if info.st_size > MAX_RECIPE_BYTES:
            raise RecipeError(f"recipe {path} is {info.st_size} bytes; a recipe is at most {MAX_RECIPE_BYTES}",
                              "name the recipe's .toml file")
        with open(path, "rb") as fh:
            data = fh.read(MAX_RECIPE_BYTES + 1)[:MAX_RECIPE_BYTES]
    except FileNotFoundError:
        raise RecipeError(f"recipe {path} not found", "check the path, or see recipes/ for examples") from None
    except IsADirectoryError:
        raise RecipeError(f"recipe {path} is a folder", "name the .toml file inside it") from None
    except OSError as err:
        raise RecipeError(f"cannot read recipe {path}: {err.strerror}", "check the file's permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise RecipeError(f"recipe {path.name}: not UTF-8 text (line {line})", "save the file as UTF-8") from None
    return parse_recipe(text, path, check_tasks=check_tasks)


__all__ = [
    "Recipe", "ModelSpec", "TaskSpec", "DiscoverySpec", "ValidationSpec", "ExportSpec", "RecipeError",
    "load_recipe", "parse_recipe", "DTYPES", "SCREENS", "SEARCHES", "OBJECTIVES", "DIRECTIONS", "DEMO_MODEL_ID",
]
