"""Recipes: the shipped ones load, every bad input is a one-line RecipeError naming the field, fuzzing finds no crash."""
from __future__ import annotations

import math
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headedit.errors import RecipeError
from headedit.recipe import DiscoverySpec, Recipe, load_recipe, parse_recipe
from headedit.tasks import Task, register_task, task_names

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
SHIPPED = sorted(RECIPES.glob("*.toml"))

# A minimal valid recipe; the corpus below edits one line of it at a time.
BASE = """\
name = "t"
[model]
id = "some/model"
[task]
name = "TASK"
"""


def _dump_value(value) -> str:
    """A tiny TOML writer (values only), so the fuzzer can produce real documents without tomli_w."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_escape(c) for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_dump_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_dump_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def _escape(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    return f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c


def _key(key: str) -> str:
    return key if key and all(c in string.ascii_letters + string.digits + "_-" for c in key) else _dump_value(key)


def dump_toml(doc: dict) -> str:
    """Top-level scalars first, then one [table] per dict value (nested dicts as inline tables)."""
    lines = [f"{_key(k)} = {_dump_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{_key(k)}]")
            lines.extend(f"{_key(kk)} = {_dump_value(vv)}" for kk, vv in v.items())
    return "\n".join(lines) + "\n"


class _SizedTask(Task):
    """A real registered task (no data needed here): the recipe only asks the registry for its name and sizes."""

    name = "recipe-test-task"
    default_sizes = (7, 9)


register_task(_SizedTask())


def some_task() -> str:
    return _SizedTask.name


# ---- shipped recipes -----------------------------------------------------------------------------
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_recipe_schema(path: Path) -> None:
    recipe = load_recipe(path, check_tasks=False)
    assert recipe.name == path.stem
    assert recipe.source_text == path.read_text(encoding="utf-8")
    assert recipe.export.out == f"exports/{path.stem}"
    assert recipe.model.trust_remote_code is False
    # to_dict is complete: writing it back out gives the same recipe
    assert parse_recipe(dump_toml(recipe.to_dict()), check_tasks=False) == recipe


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_recipe_tasks_registered(path: Path) -> None:
    recipe = load_recipe(path, check_tasks=False)
    missing = [t for t in (recipe.task.name, *recipe.validation.side_tasks) if t not in task_names()]
    if missing:
        pytest.skip(f"task(s) {missing} not registered yet")
    assert load_recipe(path) == recipe


def test_demo_recipe_values() -> None:
    r = load_recipe(RECIPES / "demo.toml", check_tasks=False)
    assert (r.model.id, r.model.dtype, r.model.device) == ("headedit:demo", "float32", "cpu")
    assert (r.task.name, r.task.discovery, r.task.heldout) == ("copy-second", 1000, 2000)
    d = r.discovery
    assert (d.screen, d.candidates, d.max_heads, d.search, d.beam) == ("single", 8, 3, "greedy", 2)
    assert r.validation.side_tasks == ("copy-first",)


def test_paper_recipes_sizes_and_chat() -> None:
    want = {
        "smollm3-arithmetic": ("HuggingFaceTB/SmolLM3-3B", "arithmetic", 2000, 1000),
        "smollm3-boolq": ("HuggingFaceTB/SmolLM3-3B", "boolq", 2000, 3270),
        "smollm3-hellaswag": ("HuggingFaceTB/SmolLM3-3B", "hellaswag", 2000, 10042),
        "smollm3-mbpp": ("HuggingFaceTB/SmolLM3-3B", "mbpp", 374, 500),
        "qwen2.5-arithmetic": ("Qwen/Qwen2.5-3B-Instruct", "arithmetic", 2000, 1000),
        "qwen2.5-boolq": ("Qwen/Qwen2.5-3B-Instruct", "boolq", 2000, 3270),
        "llama3.2-arithmetic": ("meta-llama/Llama-3.2-3B", "arithmetic", 2000, 1000),
    }
    for name, (model, task, disc, held) in want.items():
        r = load_recipe(RECIPES / f"{name}.toml", check_tasks=False)
        assert (r.model.id, r.task.name, r.task.discovery, r.task.heldout) == (model, task, disc, held), name
        if model.startswith("HuggingFaceTB"):
            assert r.task.chat and dict(r.model.chat_template_kwargs) == {"enable_thinking": False}


# ---- defaults ------------------------------------------------------------------------------------
def test_defaults_fill_everything_but_name_model_task() -> None:
    r = parse_recipe(BASE.replace("TASK", "anything"), check_tasks=False)
    assert r.discovery == DiscoverySpec()
    assert (r.model.dtype, r.model.device, r.model.batch_size, r.model.revision) == ("auto", "auto", "auto", None)
    assert (r.task.discovery, r.task.heldout, r.task.seed, r.task.chat) == (2000, 1000, 0, False)
    assert r.export.out == "exports/t" and r.export.private is True and r.export.repo_id is None
    assert r.discovery.compressed_set_count(8) == 32 and r.discovery.compressed_set_count(576) == 288


def test_task_defaults_come_from_the_registered_task() -> None:
    from headedit.tasks import get_task

    name = some_task()
    r = parse_recipe(BASE.replace("TASK", name))
    assert (r.task.discovery, r.task.heldout) == tuple(get_task(name).default_sizes) == (7, 9)


def test_frozen() -> None:
    r = parse_recipe(BASE.replace("TASK", "x"), check_tasks=False)
    with pytest.raises(Exception):
        r.name = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.model.chat_template_kwargs["a"] = 1  # type: ignore[index]


# ---- error corpus --------------------------------------------------------------------------------
def _with(section: str, line: str, task: str = "TASK") -> str:
    text = BASE if f"[{section}]" in BASE or not section else BASE + f"[{section}]\n"
    if not section:
        return line + "\n" + text
    return text.replace(f"[{section}]\n", f"[{section}]\n{line}\n")


CORPUS = [
    # (recipe text, dotted field the message must name, a word the message must contain)
    ('[model]\nid = "m"\n[task]\nname = "TASK"\n', "name", "missing"),
    ('name = "t"\n[task]\nname = "TASK"\n', "[model]", "missing"),
    ('name = "t"\n[model]\nid = "m"\n', "[task]", "missing"),
    ('name = "t"\n[model]\ndtype = "float32"\n[task]\nname = "TASK"\n', "model.id", "missing"),
    ('name = "t"\n[model]\nid = "m"\n[task]\nseed = 1\n', "task.name", "missing"),
    ('name = 3\n[model]\nid = "m"\n[task]\nname = "TASK"\n', "name", "got 3"),
    ('name = "has space"\n[model]\nid = "m"\n[task]\nname = "TASK"\n', "name", "letters"),
    ('name = "t"\nmodel = "m"\n[task]\nname = "TASK"\n', "model", "table"),
    (_with("", "colour = 1"), "colour", "allowed here: name, model"),
    (_with("model", "colour = 1"), "model.colour", "allowed here: id"),
    (_with("task", "colour = 1"), "task.colour", "allowed here: name, discovery"),
    (_with("discovery", "colour = 1"), "discovery.colour", "allowed here: screen"),
    (_with("validation", "colour = 1"), "validation.colour", "allowed here: side_tasks"),
    (_with("export", "colour = 1"), "export.colour", "allowed here: out"),
    (_with("model", 'dtype = "fp8"'), "model.dtype", "float32|bfloat16|float16"),
    (_with("model", 'device = "gpu"'), "model.device", "cuda:N"),
    (_with("model", 'device = "cuda:x"'), "model.device", "cuda:N"),
    (_with("model", "batch_size = 0"), "model.batch_size", '"auto" or an integer'),
    (_with("model", 'batch_size = "big"'), "model.batch_size", '"auto" or an integer'),
    (_with("model", 'trust_remote_code = "yes"'), "model.trust_remote_code", "true or false"),
    (_with("model", 'chat_template_kwargs = "x"'), "model.chat_template_kwargs", "table"),
    (_with("model", "chat_template_kwargs = { a = 1 }"), "model.chat_template_kwargs", "task.chat"),
    (_with("model", 'revision = ""'), "model.revision", "string"),
    (_with("task", "discovery = 0"), "task.discovery", "integer 1.."),
    (_with("task", "discovery = -5"), "task.discovery", "integer 1.."),
    (_with("task", "heldout = 2.5"), "task.heldout", "integer 1.."),
    (_with("task", "heldout = true"), "task.heldout", "integer 1.."),
    (_with("task", 'discovery = "2000"'), "task.discovery", "integer 1.."),
    (_with("task", "seed = -1"), "task.seed", "non-negative"),
    (_with("task", 'chat = "yes"'), "task.chat", "true or false"),
    (_with("task", "data_dir = 3"), "task.data_dir", "folder"),
    (_with("discovery", 'screen = "random"'), "discovery.screen", "single|compressed|gradient"),
    (_with("discovery", 'search = "beam"'), "discovery.search", "greedy|exhaustive"),
    (_with("discovery", "candidates = 0"), "discovery.candidates", "integer 1.."),
    (_with("discovery", "beam = 1.5"), "discovery.beam", "integer 1.."),
    (_with("discovery", "max_heads = 20"), "discovery.max_heads", "exceeds discovery.candidates"),
    (_with("discovery", 'search = "exhaustive"\nexhaustive_size = 8\ncandidates = 4\nmax_heads = 2'),
     "discovery.exhaustive_size", "exceeds"),
    (_with("discovery", "exhaustive_size = 9"), "discovery.exhaustive_size", "1..8"),
    (_with("discovery", "min_gain = -1"), "discovery.min_gain", "0..100"),
    (_with("discovery", "min_gain = nan"), "discovery.min_gain", "0..100"),
    (_with("discovery", "early_stop_alpha = 1.0"), "discovery.early_stop_alpha", "strictly between"),
    (_with("discovery", "compressed_fraction = 0"), "discovery.compressed_fraction", "strictly between"),
    (_with("discovery", 'compressed_sets = "many"'), "discovery.compressed_sets", '"auto" or'),
    (_with("discovery", "early_stop = 1"), "discovery.early_stop", "true or false"),
    (_with("validation", 'side_tasks = "boolq"'), "validation.side_tasks", "array of task names"),
    (_with("validation", "side_tasks = [1]"), "validation.side_tasks", "array of task names"),
    (_with("validation", "bootstrap = 10"), "validation.bootstrap", "100..1000000"),
    (_with("validation", "alpha = 0.9"), "validation.alpha", "(0, 0.5]"),
    (_with("export", 'repo_id = "no-slash"'), "export.repo_id", "owner/name"),
    (_with("export", "private = 0"), "export.private", "true or false"),
    (_with("export", "out = []"), "export.out", "folder"),
    ('name = "t"\n[model\nid = "m"\n', "TOML", "line 2"),
    ('name = "t"\nname = "u"\n', "TOML", "line 2"),
    ('name = "t"\n[model]\nid = "m"\n[task]\nname = "no-such-task-xyzzy"\n', "task.name", "unknown task"),
]


@pytest.mark.parametrize("text,field,word", CORPUS, ids=[f"{i}-{c[1]}" for i, c in enumerate(CORPUS)])
def test_error_corpus(text: str, field: str, word: str) -> None:
    checks = "no-such-task" in text
    text = text.replace("TASK", "whatever")
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "bad.toml", check_tasks=checks)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("recipe bad.toml: ")
    assert field in msg and word in msg, msg


def test_unknown_side_task_names_its_index() -> None:
    name = some_task()
    text = _with("validation", 'side_tasks = ["no-such-task-xyzzy"]').replace("TASK", name)
    with pytest.raises(RecipeError, match=r"validation\.side_tasks\[0\] names unknown task 'no-such-task-xyzzy'"):
        parse_recipe(text)
    with pytest.raises(RecipeError, match="lists a task twice"):
        parse_recipe(_with("validation", f'side_tasks = ["{name}", "{name}"]').replace("TASK", name))


def test_load_recipe_file_errors(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "nope.toml")
    with pytest.raises(RecipeError, match="is a folder"):
        load_recipe(tmp_path)
    bad = tmp_path / "latin.toml"
    bad.write_bytes(b'name = "t"\n# caf\xe9\n')
    with pytest.raises(RecipeError, match=r"not UTF-8 text \(line 2\)"):
        load_recipe(bad)


# ---- fuzzing -------------------------------------------------------------------------------------
KEYS = ["name", "model", "task", "discovery", "validation", "export", "id", "dtype", "device", "screen",
        "candidates", "max_heads", "beam", "side_tasks", "out", "repo_id", "private", "heldout", "seed", "chat",
        "chat_template_kwargs", "batch_size", "min_gain", "compressed_sets", "early_stop_alpha", "x"]
scalars = (st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.sampled_from(["auto", "single", "greedy", "cpu", "cuda:0", "bfloat16", "a/b"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=3), max_leaves=8)
documents = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), values, max_size=7)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_fuzz_documents_only_raise_recipe_error(doc: dict) -> None:
    try:
        recipe = parse_recipe(dump_toml(doc), "fuzz.toml")
    except RecipeError as err:
        assert "\n" not in str(err) and str(err).startswith("recipe fuzz.toml")
    else:
        assert isinstance(recipe, Recipe)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('[]{}="\'.,#\n abc123-_:\\tf')), max_size=80))
def test_fuzz_text_only_raises_recipe_error(text: str) -> None:
    try:
        parse_recipe(text, check_tasks=False)
    except RecipeError:
        pass


SECTION_FIELDS = [("model", k) for k in ("id", "revision", "dtype", "device", "chat_template_kwargs",
                                          "trust_remote_code", "batch_size")] + \
    [("task", k) for k in ("discovery", "heldout", "seed", "data_dir", "chat")] + \
    [("discovery", k) for k in DiscoverySpec.__dataclass_fields__] + \
    [("validation", k) for k in ("side_tasks", "bootstrap", "alpha")] + [("export", k) for k in ("out", "repo_id", "private")]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SECTION_FIELDS), values)
def test_fuzz_one_field_of_a_valid_recipe(where: tuple[str, str], value) -> None:
    """Start from a valid recipe and replace one field: either it parses to that value's type, or a RecipeError names it."""
    section, key = where
    doc = {"name": "t", "model": {"id": "m"}, "task": {"name": some_task()}}
    doc.setdefault(section, {})[key] = value
    try:
        recipe = parse_recipe(dump_toml(doc))
    except RecipeError as err:
        assert f"{section}.{key}" in str(err) or section == "model" and "task.chat" in str(err), str(err)
    else:
        got = getattr(getattr(recipe, section), key)
        assert got == value or (isinstance(got, tuple) and list(got) == value) or dict(got) == value
