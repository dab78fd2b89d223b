"""The setup form as recipe text: the form never validates anything itself.

Every value goes through `headedit.recipe.parse_recipe`, the same validator the CLI uses, and a
`RecipeError` is mapped back to the form field whose dotted key it carries (`err.field == "task.name"` ->
the task input).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headedit.errors import HeadeditError, RecipeError
from headedit.toml_text import dumps_toml


@dataclass(frozen=True)
class FormField:
    id: str  # widget id in the setup screen
    key: str  # dotted recipe key
    label: str
    kind: str = "str"  # str | int | choice


FIELDS: tuple[FormField, ...] = (
    FormField("model", "model.id", "Model"),
    FormField("task", "task.name", "Task"),
    FormField("direction", "discovery.direction", "Direction", "choice"),  # improve the task, or remove it
    FormField("discovery", "task.discovery", "Discovery n", "int"),
    FormField("heldout", "task.heldout", "Held-out n", "int"),
    FormField("screen", "discovery.screen", "Screen", "choice"),
    FormField("candidates", "discovery.candidates", "Candidates", "int"),
    FormField("max_heads", "discovery.max_heads", "Max heads", "int"),
    FormField("device", "model.device", "Device"),
    FormField("dtype", "model.dtype", "Dtype", "choice"),
)
FIELD_BY_KEY = {f.key: f for f in FIELDS}
DEFAULT_VALUES = {
    "model": "", "task": "", "direction": "improve", "discovery": "2000", "heldout": "1000", "screen": "single",
    "candidates": "16", "max_heads": "6", "device": "auto", "dtype": "auto",
}


def form_values(recipe: Any) -> dict[str, str]:
    """The form's text for each field of a loaded recipe."""
    data = recipe.to_dict()
    out: dict[str, str] = {}
    for f in FIELDS:
        section, key = f.key.split(".")
        value = data.get(section, {}).get(key)
        out[f.id] = "" if value is None else str(value)
    return out


def _coerce(field: FormField, text: str) -> Any:
    text = text.strip()
    if field.kind == "int":
        try:
            return int(text)
        except ValueError:
            return text  # the validator names the field and the expected type
    return text


def recipe_text(values: dict[str, str], base: Any | None = None) -> str:
    """Recipe TOML for the form; the base recipe's text verbatim when the form did not change it."""
    if base is not None and form_values(base) == {f.id: values.get(f.id, "").strip() for f in FIELDS}:
        return base.source_text
    data: dict[str, Any] = base.to_dict() if base is not None else {"name": "custom", "model": {}, "task": {}, "discovery": {}}
    for f in FIELDS:
        section, key = f.key.split(".")
        text = values.get(f.id, "")
        if text.strip() == "" and f.kind != "str":
            data.setdefault(section, {}).pop(key, None)
            continue
        data.setdefault(section, {})[key] = _coerce(f, text)
    if base is not None:
        data["name"] = base.name if "-custom" in base.name else f"{base.name}-custom"[:96]
    return dumps_toml(data)


def validate(values: dict[str, str], base: Any | None = None) -> tuple[Any | None, str, dict[str, str]]:
    """(recipe or None, recipe text, {field id: message}); unknown fields land under the key ''."""
    # lazy: the app paints before the pipeline and its models load
    from headedit.recipe import parse_recipe

    text = recipe_text(values, base)
    try:
        recipe = parse_recipe(text, base.path if base is not None and text == base.source_text else None)
    except RecipeError as err:
        return None, text, {error_field(err): str(err)}
    return recipe, text, {}


def error_field(err: HeadeditError) -> str:
    """The form field a recipe error is about ('' when it is about none of them, or about the whole file)."""
    field = FIELD_BY_KEY.get(getattr(err, "field", None) or "")
    return field.id if field else ""


def recipe_dirs() -> list[Path]:
    """Where user and bundled recipes live: ./recipes, then the recipes installed with headedit."""
    out = [Path("recipes")] if Path("recipes").is_dir() else []
    try:
        import headedit.recipes as bundled

        out += [Path(p) for p in bundled.__path__ if Path(p).is_dir()]
    except ImportError:  # pragma: no cover - a source tree without the recipes package
        pass
    seen: set[Path] = set()
    unique: list[Path] = []
    for p in out:  # first occurrence of each resolved folder, in order
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def list_recipes(dirs: list[Path] | None = None) -> list[Path]:
    found: dict[str, Path] = {}
    for folder in dirs if dirs is not None else recipe_dirs():
        for path in sorted(folder.glob("*.toml")):
            found.setdefault(path.name, path)
    names = sorted(found, key=lambda n: (n != "demo.toml", n))  # the demo first
    return [found[n] for n in names]


def list_runs(root: Path, limit: int = 20) -> list[tuple[Path, str]]:
    """Recent run folders, newest first, with the stage each reached."""
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if (p / "run.json").is_file()]
    runs.sort(key=lambda p: (p / "run.json").stat().st_mtime, reverse=True)
    out = []
    for path in runs[:limit]:
        stage = "validated" if (path / "validation.json").is_file() else (
            "selected" if (path / "selection.json").is_file() else "unfinished")
        out.append((path, stage))
    return out
