"""Bad input in the setup form and the candidates' head-set field is shown inline, never crashes,
and never opens the error modal; the form reuses the recipe validator's own messages."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from headedit.tui import form
from headedit.tui.app import HeadeditApp
from headedit.tui.screens.candidates import CandidatesScreen
from headedit.tui.screens.setup import SetupScreen
from testkit.recipes import recipe_toml

from headedit.recipe import parse_recipe

from .conftest import wait_workers
from .runfolder import write_run

pytestmark = pytest.mark.anyio

RECIPE = recipe_toml("form-test", model={"id": "MODEL", "device": "cpu"},
                     task={"name": "arithmetic", "discovery": 40, "heldout": 40})


def make_app(tmp_path: Path, model: str) -> HeadeditApp:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "form-test.toml").write_text(RECIPE.replace("MODEL", model))
    return HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[recipes])


async def settle(pilot) -> None:
    await pilot.pause(0.6)  # the inspect debounce
    await wait_workers(pilot)


def error_text(screen, field: str) -> str:
    widget = screen.query_one(f"#{field}-error")
    return str(widget.render()) if widget.has_class("shown") else ""


async def test_form_marks_bad_fields_inline(tmp_path: Path, tiny_dir: Path) -> None:
    app = make_app(tmp_path, str(tiny_dir))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("enter")  # load the recipe into the form
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, SetupScreen)
        assert screen.layout_info is not None and screen.layout_info["num_layers"] == 2
        assert "2 layers × 4 heads" in str(screen.query_one("#layout").render())
        assert all(error_text(screen, f.id) == "" for f in form.FIELDS)

        # unknown task: the validator's message, under the task field
        screen.query_one("#task").value = "no-such-task"
        await pilot.pause()
        assert "unknown task 'no-such-task'" in error_text(screen, "task")
        assert screen.query_one("#task").has_class("invalid")
        screen.query_one("#task").value = "arithmetic"
        await pilot.pause()
        assert error_text(screen, "task") == ""

        # a non-number size names the field and the expected type
        screen.query_one("#discovery").value = "12x"
        await pilot.pause()
        assert "task.discovery must be an integer" in error_text(screen, "discovery")
        screen.query_one("#discovery").value = "40"

        # malformed and out-of-range head sets, checked against the inspected layout
        screen.query_one("#heads").value = "0.x"
        await pilot.pause()
        assert "malformed head '0.x'" in error_text(screen, "heads")
        screen.query_one("#heads").value = "5.0"
        await pilot.pause()
        assert "layer 5 not in 0..1" in error_text(screen, "heads")
        await pilot.press("ctrl+r")  # refused: still on the setup screen
        await pilot.pause()
        assert app.screen is screen
        screen.query_one("#heads").value = "1.*"
        await pilot.pause()
        assert error_text(screen, "heads") == ""

        # a model path that does not exist: inline, after the inspect worker fails
        screen.query_one("#model").value = str(tmp_path / "missing-model")
        await settle(pilot)
        assert "not found" in error_text(screen, "model")
        assert screen.layout_info is None
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.screen is screen
        assert app.errors == []  # nothing went to the modal, nothing crashed


async def test_candidates_head_set_field_inline(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", validated=False)
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=(80, 24)) as pilot:
        await app.push_screen(CandidatesScreen(run_dir))
        await pilot.pause()
        screen = app.screen
        field = screen.query_one("#set")
        field.value = "0.1,,"
        await pilot.pause()
        assert "malformed head set" in error_text(screen, "set")
        field.value = "0.9"
        await pilot.pause()
        assert "head 9 not in 0..3" in error_text(screen, "set")
        await pilot.press("b")  # bake refused while the set is invalid
        await pilot.pause()
        assert app.screen is screen
        field.value = "1.0, 0.1"
        await pilot.pause()
        assert error_text(screen, "set") == "" and screen.current == "0.1,1.0"
        assert screen.query_one("HeadHeatmap").selection_text == "0.1,1.0"
        assert app.errors == []


async def test_action_keys_are_not_typed_into_the_head_set_box(tmp_path: Path) -> None:
    """With the head-set box focused, `e` evaluates what was typed (it was typed in: `malformed head '1.1 e'`),
    `a` goes back to the search's choice; letters never enter the box."""
    from headedit.tui.widgets.candidates import HAND_MARK

    run_dir = write_run(tmp_path / "run", validated=False)
    app = HeadeditApp(runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=(80, 24)) as pilot:
        await app.push_screen(CandidatesScreen(run_dir))
        await pilot.pause()
        screen = app.screen
        field = screen.query_one("#set")
        field.focus()
        field.value = ""
        await pilot.press(*"1.1", "x", "e")
        await pilot.pause()
        assert field.value == "1.1" and error_text(screen, "set") == ""
        await wait_workers(pilot)
        assert app.errors == [], app.errors
        row = screen.query_one("CandidateTable").rows_data["1.1"]
        assert row["note"] == HAND_MARK and row["n"] == 200 and 0.0 <= row["acc"] <= 1.0
        await pilot.press("a")
        assert field.value == "0.1,1.2" and screen.current == "0.1,1.2"


def test_recipe_errors_reach_their_field_as_data() -> None:
    """The field comes from RecipeError.field, whatever the message says."""
    from headedit.errors import RecipeError

    assert form.error_field(RecipeError("anything at all", field="task.heldout")) == "heldout"
    assert form.error_field(RecipeError("recipe x: task.name is missing")) == ""  # no field: the form-wide line
    assert form.error_field(RecipeError("...", field="validation.alpha")) == ""  # not on the form
    try:
        parse_recipe(RECIPE.replace('device = "cpu"', 'device = "cpu"\ndtype = "float64"'), check_tasks=False)
    except RecipeError as err:
        assert err.field == "model.dtype" and form.error_field(err) == "dtype"
    else:
        raise AssertionError("float64 is not a dtype headedit accepts")


def test_form_text_is_the_recipe_verbatim_until_edited(tmp_path: Path) -> None:
    recipe = parse_recipe(RECIPE.replace("MODEL", "some/model"), check_tasks=False)
    values = form.form_values(recipe)
    assert form.recipe_text(values, recipe) == recipe.source_text
    values["candidates"] = "4"
    values["max_heads"] = "2"
    edited = parse_recipe(form.recipe_text(values, recipe), check_tasks=False)
    assert (edited.discovery.candidates, edited.discovery.max_heads) == (4, 2)
    assert edited.model.id == "some/model" and edited.task.discovery == 40
    assert edited.name == "form-test-custom"


def test_import_headedit_does_not_import_textual() -> None:
    code = (
        "import sys, headedit; assert 'textual' not in sys.modules, 'headedit';"
        "import headedit.pipeline; assert 'textual' not in sys.modules, 'pipeline';"
        "import headedit.cli; headedit.cli.build_parser(); assert 'textual' not in sys.modules, 'cli'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tui_command_registered_and_bad_target_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "headedit", "tui", str(tmp_path / "nope.toml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "nope.toml not found" in out.stderr
    assert "Traceback" not in out.stderr
    helped = subprocess.run([sys.executable, "-m", "headedit", "tui", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0 and "RECIPE_OR_RUN" in helped.stdout


async def test_open_run_folder_at_the_step_it_reached(tmp_path: Path) -> None:
    from headedit.tui.screens.bake_validate import BakeValidateScreen
    from headedit.tui.screens.error import ErrorModal

    validated = write_run(tmp_path / "runs" / "a-validated")
    selected = write_run(tmp_path / "runs" / "b-selected", validated=False)
    app = HeadeditApp(validated, runs_root=tmp_path / "runs", recipe_dirs=[])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, BakeValidateScreen)
        assert app.screen.validation["gain_points"] == 96.0
        await pilot.press("escape", "escape", "escape")  # back through candidates and discovery
        setup = app.screen
        assert isinstance(setup, SetupScreen)
        assert [p.name for p, _ in setup.runs] and {p.name for p, _ in setup.runs} == {"a-validated", "b-selected"}
        app.open_run(selected)
        await pilot.pause()
        assert isinstance(app.screen, CandidatesScreen)
        await pilot.press("escape", "escape")
        assert app.screen is setup
        app.open_run(tmp_path)  # not a run folder: the modal, no crash
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal) and "not a headedit run folder" in str(app.errors[-1])
        await pilot.press("enter")
        screen_json = json.loads((selected / "screen.json").read_text())
        screen_json["delta"][0][1] = "x"  # parses, but not what discovery writes
        (selected / "screen.json").write_text(json.dumps(screen_json))
        app.open_run(selected)
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal) and "screen.json" in app.screen.message + (app.screen.hint or "")
        (selected / "selection.json").write_text("{not json")
        await pilot.press("enter")
        app.open_run(selected)
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal) and "selection.json is corrupt" in str(app.errors[-1])
        await pilot.press("enter")
        assert app.screen is setup
