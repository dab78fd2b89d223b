"""Setup: pick a recipe or fill the form; the model's layout appears as soon as it is named.

Invalid fields are marked inline with the recipe validator's own message; recent runs can be reopened.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from headedit.tui import form
from headedit.tui.screens.base import StepScreen
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.timer import Timer
from textual.widgets import Button, Footer, Header, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from headedit.errors import HeadeditError
from headedit.model.heads import HeadLayout, parse_heads

CHOICES = {"screen": ("single", "compressed", "gradient"), "dtype": ("auto", "float32", "bfloat16", "float16"),
           "direction": ("improve", "remove")}
INSPECT_DELAY = 0.4  # seconds of quiet typing before the model is inspected


def layout_from_info(info: dict[str, Any]) -> HeadLayout:
    """The model's heads from `inspect_model`'s dict (per layer when the model has them), for range checks."""
    return HeadLayout.from_dict(info)


def describe_layout(info: dict[str, Any]) -> str:
    params = info.get("parameters")
    size = f" · {params:,} parameters" if isinstance(params, int) else ""
    return (f"{info['architecture']} · {info['num_layers']} layers × {info['num_heads']} heads "
            f"({info['num_kv_heads']} KV) · head_dim {info['head_dim']}{size}")


class SetupScreen(StepScreen):
    BINDINGS = [
        Binding("ctrl+r", "start", "Start discovery", priority=True),
        Binding("ctrl+o", "open_run", "Open run"),
        Binding("f2", "focus_recipes", "Recipes"),
    ]

    def __init__(self, runs_root: Path, recipe_dirs: list[Path] | None = None, recipe: Path | None = None) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.initial_recipe = recipe  # `headedit tui RECIPE`: filled in once the form exists
        self.recipe_paths = form.list_recipes(recipe_dirs)
        self.base_recipe: Any | None = None
        self.layout_info: dict[str, Any] | None = None
        self.model_error: str | None = None
        self.inspected_model: str | None = None
        self._timer: Timer | None = None
        self.runs: list[tuple[Path, str]] = []
        self.ready = False  # the form's initial Changed events are not user edits

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="setup"):
            with Vertical(id="setup-left"):
                yield Label("Recipes", classes="section")
                yield OptionList(*[Option(p.stem, id=str(i)) for i, p in enumerate(self.recipe_paths)],
                                 id="recipes")
                yield Label("Recent runs", classes="section")
                yield OptionList(id="runs")
            with VerticalScroll(id="setup-form"):
                for f in form.FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(f.label, classes="field-label")
                        if f.kind == "choice":
                            yield Select([(c, c) for c in CHOICES[f.id]], value=form.DEFAULT_VALUES[f.id],
                                         allow_blank=False, compact=True, id=f.id)
                        else:
                            yield Input(form.DEFAULT_VALUES[f.id], id=f.id, compact=True,
                                        placeholder="hub id, folder or headedit:demo" if f.id == "model" else "")
                    yield Static("", id=f"{f.id}-error", classes="field-error", markup=False)
                with Horizontal(classes="field"):
                    yield Label("Compare set", classes="field-label")
                    yield Input("", id="heads", compact=True, placeholder="optional, e.g. 0.1,1.2")
                yield Static("", id="heads-error", classes="field-error", markup=False)
                yield Static("", id="form-error", classes="field-error", markup=False)
                yield Static("name a model to see its layout", id="layout", markup=False)
                yield Button("Start discovery (ctrl+r)", id="start", variant="primary")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "setup"
        self.refresh_runs()
        self.query_one("#recipes", OptionList).focus()
        if self.initial_recipe is not None:
            self.load_recipe_file(self.initial_recipe)
        self.call_after_refresh(setattr, self, "ready", True)

    # ---- recipes and runs -----------------------------------------------------------------
    def refresh_runs(self) -> None:
        self.runs = form.list_runs(self.runs_root)
        runs = self.query_one("#runs", OptionList)
        runs.clear_options()
        # two lines each, so a long run name and its stage are never cut at 80 columns
        runs.add_options([Option(Text.assemble(p.name, "\n", (f"  {stage}", "dim")), id=str(i))
                          for i, (p, stage) in enumerate(self.runs)])
        if self.runs:
            runs.highlighted = 0  # the newest run: Enter opens it without moving first

    @on(OptionList.OptionSelected, "#recipes")
    def recipe_chosen(self, event: OptionList.OptionSelected) -> None:
        self.load_recipe_file(self.recipe_paths[int(event.option.id or 0)])

    @on(OptionList.OptionSelected, "#runs")
    def run_chosen(self, event: OptionList.OptionSelected) -> None:
        self.app.open_run(self.runs[int(event.option.id or 0)][0])  # type: ignore[attr-defined]

    def action_open_run(self) -> None:
        """Ctrl+O: go to the recent runs with the newest highlighted (Enter or Ctrl+O again opens it)."""
        runs = self.query_one("#runs", OptionList)
        if not self.runs:
            self.notify(f"no runs under {self.runs_root} yet", timeout=3)
            return
        if runs.has_focus and runs.highlighted is not None:
            self.app.open_run(self.runs[runs.highlighted][0])  # type: ignore[attr-defined]
            return
        if runs.highlighted is None:
            runs.highlighted = 0
        runs.focus()

    def action_focus_recipes(self) -> None:
        self.query_one("#recipes", OptionList).focus()

    def load_recipe_file(self, path: Path) -> None:
        """Fill the form from a recipe file; a broken file is reported inline, not raised."""
        # lazy: the app paints before the pipeline and its models load
        from headedit.recipe import load_recipe

        try:
            recipe = load_recipe(path, check_tasks=False)
        except HeadeditError as err:
            self.set_error("form", str(err))
            return
        self.base_recipe = recipe
        self.set_values(form.form_values(recipe))
        self.validate_form()
        self.query_one("#model", Input).focus()

    def set_values(self, values: dict[str, str]) -> None:
        with self.prevent(Input.Changed, Select.Changed):
            for f in form.FIELDS:
                if f.kind == "choice":
                    self.query_one(f"#{f.id}", Select).value = values[f.id]
                else:
                    self.query_one(f"#{f.id}", Input).value = values[f.id]
        self.schedule_inspect(now=True)

    # ---- validation -----------------------------------------------------------------------
    def values(self) -> dict[str, str]:
        out = {}
        for f in form.FIELDS:
            widget = self.query_one(f"#{f.id}")
            out[f.id] = str(widget.value) if widget.value is not None else ""  # type: ignore[attr-defined]
        return out

    def set_error(self, field: str, message: str) -> None:
        target = self.query_one(f"#{field or 'form'}-error", Static)
        target.update(message)
        target.set_class(bool(message), "shown")
        if field and field != "form":
            self.query_one(f"#{field}").set_class(bool(message), "invalid")

    def clear_errors(self) -> None:
        for f in form.FIELDS:
            if f.id != "model" or not self.model_error:
                self.set_error(f.id, "")
        self.set_error("form", "")

    def validate_form(self) -> Any | None:
        """Run the recipe validator over the form; mark the field it names. Returns the recipe or None."""
        recipe, _, errors = form.validate(self.values(), self.base_recipe)
        self.clear_errors()
        for field, message in errors.items():
            self.set_error(field, message)
        heads_ok = self.validate_heads()
        if self.model_error:
            self.set_error("model", self.model_error)
        return recipe if heads_ok and not self.model_error else None

    def validate_heads(self) -> bool:
        text = self.query_one("#heads", Input).value.strip()
        if not text:
            self.set_error("heads", "")
            return True
        try:
            layout = layout_from_info(self.layout_info) if self.layout_info else None
            parse_heads(text, layout)
        except HeadeditError as err:
            self.set_error("heads", str(err))
            return False
        self.set_error("heads", "")
        return True

    @on(Input.Changed)
    @on(Select.Changed)
    def field_changed(self, event: Input.Changed | Select.Changed) -> None:
        if not self.ready:
            return
        if event.control.id == "model":
            self.schedule_inspect()
        self.validate_form()

    # ---- inspect --------------------------------------------------------------------------
    def schedule_inspect(self, now: bool = False) -> None:
        if self._timer is not None:
            self._timer.stop()
        model = self.query_one("#model", Input).value.strip()
        if not model:
            self.layout_info, self.model_error = None, None
            self.query_one("#layout", Static).update("name a model to see its layout")
            return
        if now:
            self.inspect_model(model)
        else:
            self._timer = self.set_timer(INSPECT_DELAY, lambda: self.inspect_model(model))

    @work(thread=True, exclusive=True, exit_on_error=False, group="inspect", name="inspect")
    def inspect_model(self, model: str) -> tuple[str, dict[str, Any]]:
        # lazy: the app paints before the pipeline and its models load
        from headedit.model.inspect import inspect_model

        self.app.call_from_thread(self.query_one("#layout", Static).update, f"inspecting {model}…")
        return model, inspect_model(model)

    def worker_done(self, name: str, result: Any) -> None:
        if name == "inspect":
            model, info = result
            if model != self.query_one("#model", Input).value.strip():
                return  # typed on since
            self.layout_info, self.model_error, self.inspected_model = info, None, model
            self.query_one("#layout", Static).update(describe_layout(info))
            self.validate_form()

    def worker_failed(self, name: str, error: BaseException | None) -> None:
        if name == "inspect":  # a bad model name is a form error, shown inline
            if error is None:
                return
            self.layout_info = None
            self.model_error = str(error) if isinstance(error, HeadeditError) else f"cannot inspect: {error}"
            self.query_one("#layout", Static).update("")
            self.validate_form()
            return
        super().worker_failed(name, error)

    # ---- start ----------------------------------------------------------------------------
    @on(Button.Pressed, "#start")
    def start_pressed(self) -> None:
        self.action_start()

    def action_start(self) -> None:
        recipe = self.validate_form()
        if recipe is None:
            self.notify("fix the marked fields first", severity="warning", timeout=3)
            return
        model = self.query_one("#model", Input).value.strip()
        if self.layout_info is None or self.inspected_model != model:
            self.notify("still reading the model's layout…", timeout=2)
            self.schedule_inspect(now=True)
            return
        heads = self.query_one("#heads", Input).value.strip() or None
        self.app.start_discovery(recipe, self.layout_info, compare=heads)  # type: ignore[attr-defined]
