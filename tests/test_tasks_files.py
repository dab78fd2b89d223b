"""The JSONL/CSV shortcut: rows, templates, labels, carved splits, recipe fields, and its error messages."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit.recipes import recipe_toml

from headedit.errors import RecipeError, TaskError
from headedit.recipe import parse_recipe
from headedit.tasks import get_task
from headedit.tasks.files import FileSpec, FileTask

ROOT = Path(__file__).resolve().parents[1]


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def task_toml(path: Path, **fields: object) -> Path:
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items())
    path.write_text("[task]\n" + body)
    return path


def test_jsonl_choices_labels_and_carved_splits(tmp_path):
    rows = [{"q": f"item {i}", "y": [0, 1, True, False, " yes", "no"][i % 6]} for i in range(30)]
    data = jsonl(tmp_path / "d.jsonl", rows[:3] + [""] + rows[3:])  # a blank line is not a row
    task = get_task(str(task_toml(tmp_path / "t.toml", data=str(data), prompt="Q: {q}\nA:", choices=[" no", " yes"],
                                  label="y")))
    assert task.kind == "choice" and task.metric == "acc" and task.default_sizes == (15, 15)
    disc, held = task.load("discovery"), task.load("heldout")
    assert "carved" in disc.note and not {e.index for e in disc.examples} & {e.index for e in held.examples}
    every = sorted(list(disc.examples) + list(held.examples), key=lambda e: e.index)
    assert [e.index for e in every] == list(range(30))  # row numbers of the file
    assert every[4].meta["line"] == 6 and every[4].prompt == "Q: item 4\nA:"
    assert [e.label for e in every[:6]] == [0, 1, 1, 0, 1, 0]  # int, bool, and the choice's own text
    assert [e.index for e in task.load("heldout", 5).examples] == [e.index for e in task.load("heldout", 5).examples]
    with pytest.raises(TaskError, match="carved 15 discovery / 15 held-out"):
        task.load("heldout", 16)


def test_csv_choice_templates_and_exact_target(tmp_path):
    (tmp_path / "d.csv").write_text('country,a,b,answer,capital\nFrance,Paris,Lyon,0,Paris\n"Korea, South",Busan,Seoul,1,Seoul\n')
    mc = FileTask("mc", FileSpec(str(tmp_path / "d.csv"), "Capital of {country}?", (" {a}", " {b}"), "answer"))
    first, second = mc.examples()
    assert (first.choices, first.label, second.prompt, second.label) == ((" Paris", " Lyon"), 0, "Capital of Korea, South?", 1)
    exact = FileTask("ex", FileSpec(str(tmp_path / "d.csv"), "Capital of {country}? {{literal}}", target=" {capital}"))
    assert exact.kind == "exact" and exact.examples()[1].target == " Seoul"
    assert exact.examples()[0].prompt == "Capital of France? {literal}"
    by_field = FileTask("f", FileSpec(str(tmp_path / "d.csv"), "{country}", target="capital"))
    assert by_field.examples()[0].target == "Paris"


def test_the_two_front_ends_build_the_same_examples(monkeypatch):
    """recipes/tasks/capitals.toml (shortcut) and capitals.yaml (lm-eval) define the same task."""
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(ROOT)
    ours, theirs = get_task("recipes/tasks/capitals.toml"), get_task("recipes/tasks/capitals.yaml")
    a = sorted(list(ours.load("discovery").examples) + list(ours.load("heldout").examples), key=lambda e: e.index)
    b = sorted(list(theirs.load("discovery").examples) + list(theirs.load("heldout").examples), key=lambda e: e.index)
    assert [(e.index, e.prompt, e.choices, e.label) for e in a] == [(e.index, e.prompt, e.choices, e.label) for e in b]
    assert len(a) == 24


def recipe(tmp_path: Path, task: str) -> str:
    """A recipe whose [task] table is the raw TOML `task` (the inline-task fields are what these tests are about)."""
    return recipe_toml("r", task={}) + f"{task}\n"


def test_recipe_inline_fields_register_the_task_and_round_trip(tmp_path):
    data = jsonl(tmp_path / "d.jsonl", [{"q": str(i), "y": i % 2} for i in range(8)])
    text = recipe(tmp_path, f'name = "parity"\ndata = "{data}"\nprompt = "{{q}} is"\nchoices = [" even", " odd"]\n'
                            'label = "y"')
    parsed = parse_recipe(text)
    assert (parsed.task.discovery, parsed.task.heldout, parsed.task.choices) == (4, 4, (" even", " odd"))
    task = get_task("parity")
    assert task.load("heldout").examples[0].choices == (" even", " odd")
    assert parsed.to_dict()["task"]["choices"] == [" even", " odd"] and "lm_eval" not in parsed.to_dict()["task"]
    assert parse_recipe(text) == parsed  # parsing again (a resumed run) registers the same task again


@pytest.mark.parametrize(("task", "message"), [
    ('name = "x"\ndata = "d.jsonl"\nchoices = [" a", " b"]\nlabel = "y"', "task.prompt is missing"),
    ('name = "x"\ndata = "d.jsonl"\nprompt = "{q}"\nchoices = [" a", " b"]\nlabel = "y"\ntarget = "t"',
     "task.choices and task.target are both set"),
    ('name = "x"\ndata = "d.jsonl"\nprompt = "{q}"\nchoices = [" a", " b"]', "task.label is missing"),
    ('name = "x"\nprompt = "{q}"', "task.prompt needs task.data"),
    ('name = "x"\ninclude_path = "tasks"', "task.include_path needs task.lm_eval"),
    ('lm_eval = "boolq"\ndata = "d.jsonl"', "task.data cannot be combined with task.lm_eval"),
    ('name = "boolq"\ndata = "d.jsonl"\nprompt = "{q}"\ntarget = "t"', "'boolq' is a built-in task"),
    ('name = "x"\ndata = "d.jsonl"\nprompt = "{q}"\nchoices = [" a"]\nlabel = "y"', "task.choices must be"),
    ('name = "x"\ndata = "d.jsonl"\nprompt = "{q.attr}"\ntarget = "t"', "not a plain field name"),
    ('name = "x"\ndata = "missing.jsonl"\nprompt = "{q}"\ntarget = "t"', "recipe r.toml: task.data file missing.jsonl not found"),
])
def test_recipe_field_errors_name_the_key(tmp_path, monkeypatch, task, message):
    monkeypatch.chdir(tmp_path)
    jsonl(tmp_path / "d.jsonl", [{"q": "a", "y": 0, "t": "x"}, {"q": "b", "y": 1, "t": "z"}])
    with pytest.raises(RecipeError) as info:
        parse_recipe(recipe(tmp_path, task), tmp_path / "r.toml")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_recipe_lm_eval_name_with_include_path(tmp_path, monkeypatch):
    """task.lm_eval + task.include_path: lm-eval finds the task in the user's folder; its name is lm-eval:NAME."""
    pytest.importorskip("lm_eval")
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    yaml = (ROOT / "recipes" / "tasks" / "capitals.yaml").read_text()
    yaml = yaml.replace("task: capitals", "task: my_capitals").replace(
        "recipes/tasks/capitals.jsonl", str(ROOT / "recipes" / "tasks" / "capitals.jsonl"))
    (folder / "capitals.yaml").write_text(yaml)
    parsed = parse_recipe(recipe(tmp_path, f'lm_eval = "my_capitals"\ninclude_path = "{folder}"'))
    assert parsed.task.name == "lm-eval:my_capitals" and parsed.task.include_path == str(folder)
    task = get_task("lm-eval:my_capitals")
    assert task.kind == "choice" and task.default_sizes == (12, 12) and parsed.task.discovery == 12
    assert task.load("heldout").examples[0].choices[0].startswith(" ")
    with pytest.raises(RecipeError, match="task.name must be 'lm-eval:my_capitals'"):
        parse_recipe(recipe(tmp_path, f'name = "x"\nlm_eval = "my_capitals"\ninclude_path = "{folder}"'))
