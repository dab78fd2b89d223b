"""Plain data files as tasks, no YAML: a JSONL or CSV file, a prompt template, and choices + label or a target.

The shortcut is five fields (in a recipe's [task] table, or a task TOML that `--task` names):
- `data`: the JSONL (one JSON object per line) or CSV file; relative paths resolve against the working folder;
- `prompt`: a template, `{field}` inserts a row's field (`{{` and `}}` are literal braces);
- `choices` (a list of templates, e.g. `[" no", " yes"]` or `[" {a}", " {b}"]`, or the name of a field that holds
  a list of strings) with `label` (the field holding the 0-based index of the right choice, `true`/`false` for
  two choices, or the right choice's text): multiple choice, scored by summed log-likelihood (acc);
- or `target` (a field name, or a template such as `" {answer}"`): greedy exact match of that continuation.
Continuations are appended to the prompt verbatim, so start them with a space where a word follows.
Every row is checked when the task loads; the first bad one is named by its line.
The file has one split: discovery and held-out are carved from it without overlap by a seeded shuffle (the
split's note says so), and every example's `index` is its row number (0-based, blank lines not counted).
"""
from __future__ import annotations

import csv
import json
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headedit.errors import TaskError
from headedit.tasks.base import Example, Split, SplitName, Task
from headedit.tasks.source import TaskSource, file_entry

SHORTCUT_KEYS = ("data", "prompt", "choices", "label", "target")
DISCOVERY_POOL = 2000  # at most this many rows go to discovery; the rest are held out
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


@dataclass(frozen=True)
class FileSpec:
    """The shortcut's fields, as written. `where` prefixes error messages (e.g. "recipe x.toml")."""

    data: str
    prompt: str
    choices: tuple[str, ...] | str | None = None
    label: str | None = None
    target: str | None = None
    where: str = "task"
    prefix: str = "task."  # how the fields are spelled to the user: task.prompt, ...

    def key(self, name: str) -> str:
        return self.prefix + name


def template_fields(template: str, key: str, where: str) -> list[str]:
    """The field names a `{field}` template uses; anything else (attributes, indexing, bad braces) is an error."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        raise TaskError(f"{where}: {key} is not a valid template ({err})",
                        "write {field} for a field and {{ or }} for a literal brace") from None
    names = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        plain = bool(name) and not name.isdigit() and all(c.isalnum() or c in "_- " for c in name)
        if not plain or spec or conversion:
            raise TaskError(f"{where}: {key} uses {{{name}{'!' + conversion if conversion else ''}"
                            f"{':' + spec if spec else ''}}}, not a plain field name",
                            "write {field} with a field of the data; {{ and }} are literal braces")
        names.append(name)
    return names


def check_spec(spec: FileSpec) -> None:
    """Cross-field rules: a prompt, and exactly one of (choices with label) or target."""
    if not spec.prompt:
        raise TaskError(f"{spec.where}: {spec.key('prompt')} is missing", "task.data needs a prompt template")
    if spec.choices is not None and spec.target is not None:
        raise TaskError(f"{spec.where}: {spec.key('choices')} and {spec.key('target')} are both set",
                        "choices + label make a multiple-choice task, target an exact-match one: keep one")
    if spec.choices is None and spec.target is None:
        raise TaskError(f"{spec.where}: {spec.key('target')} or {spec.key('choices')} is missing",
                        'add choices = [" no", " yes"] with label = "FIELD", or target = "FIELD"')
    if spec.choices is not None and not spec.label:
        raise TaskError(f"{spec.where}: {spec.key('label')} is missing",
                        "name the field that holds the right choice's index")
    if spec.target is None and spec.label is not None and spec.choices is None:
        raise TaskError(f"{spec.where}: {spec.key('label')} needs {spec.key('choices')}", "add the choices")
    if spec.choices is not None and not isinstance(spec.choices, str) and len(spec.choices) < 2:
        raise TaskError(f"{spec.where}: {spec.key('choices')} must list at least two choices", 'e.g. [" no", " yes"]')
    template_fields(spec.prompt, spec.key("prompt"), spec.where)
    if isinstance(spec.choices, tuple):
        for i, choice in enumerate(spec.choices):
            template_fields(choice, f"{spec.key('choices')}[{i}]", spec.where)
    if spec.target is not None and "{" in spec.target:
        template_fields(spec.target, spec.key("target"), spec.where)


def read_rows(path: Path, key: str, where: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) of every record in a JSONL or CSV file; the first bad line is named."""
    if path.suffix.lower() not in SUFFIXES:
        raise TaskError(f"{where}: {key} {path.name} is not a .jsonl or .csv file", "convert it to JSON lines or CSV")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TaskError(f"{where}: {key} file {path} not found",
                        "check the path; relative paths start at the working folder") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TaskError(f"{where}: cannot read {key} file {path.name} ({type(err).__name__})",
                        "save it as UTF-8 text") from None
    rows: list[tuple[int, dict[str, Any]]] = []
    if path.suffix.lower() in (".csv", ".tsv"):
        reader = csv.DictReader(text.splitlines(), delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        try:
            for row in reader:
                if None in row:
                    raise TaskError(f"{path.name} line {reader.line_num} has more fields than the header",
                                    "quote fields that contain the delimiter")
                rows.append((reader.line_num, dict(row)))
        except csv.Error as err:
            raise TaskError(f"{path.name} line {reader.line_num} is not valid CSV ({err})", "fix the quoting") from None
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise TaskError(f"{path.name} line {lineno} is not valid JSON: {err.msg} (column {err.colno})",
                                "each line must hold one JSON object") from None
            if not isinstance(value, dict):
                raise TaskError(f"{path.name} line {lineno} is a JSON {type(value).__name__}, not an object",
                                'each line must be one object such as {"question": ..., "label": 0}')
            rows.append((lineno, value))
    if not rows:
        raise TaskError(f"{where}: {key} file {path.name} has no rows", "add at least two rows")
    return rows


def render(template: str, row: Mapping[str, Any], key: str, where: str) -> str:
    """The template with each `{field}` replaced by the row's value (str of it); no other format semantics."""
    template_fields(template, key, where)  # validates
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        if name not in row:
            raise TaskError(f"{where}: {key} names field {name!r}, which this row lacks",
                            "fields here: " + ", ".join(map(str, list(row)[:12])))
        value = row[name]
        out.append(value if isinstance(value, str) else json.dumps(value) if isinstance(value, (list, dict)) else str(value))
    return "".join(out)


class FileTask(Task):
    """A task over one JSONL/CSV file (see the module docstring)."""

    def __init__(self, name: str, spec: FileSpec, task_file: Path | None = None, read: bool = True) -> None:
        """`read=False` defers reading (and checking) the rows to first use; `default_sizes` is exact after it."""
        check_spec(spec)
        self.name = name
        self.spec = spec
        self.task_file = task_file
        self.kind = "choice" if spec.choices is not None else "exact"
        self.metric = "acc" if self.kind == "choice" else "exact_match"
        self.dataset_id = None
        self._rows: tuple[tuple[float, int], list[Example]] | None = None
        if read:
            self.examples()

    @property
    def path(self) -> Path:
        return Path(self.spec.data).expanduser()

    def examples(self) -> list[Example]:
        """Every row as an example (checked; re-read when the file changes)."""
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime, stat.st_size)
        except OSError:
            stamp = (0.0, -1)
        if self._rows is None or self._rows[0] != stamp:
            rows = read_rows(self.path, self.spec.key("data"), self.spec.where)
            self._rows = (stamp, [self.example(i, lineno, row) for i, (lineno, row) in enumerate(rows)])
            pool = min(DISCOVERY_POOL, len(rows) // 2)
            self.default_sizes = (pool, len(rows) - pool)
        return self._rows[1]

    def example(self, index: int, lineno: int, row: Mapping[str, Any]) -> Example:
        spec, where = self.spec, f"{self.path.name} line {lineno}"
        prompt = render(spec.prompt, row, spec.key("prompt"), where)
        if spec.target is not None:
            if "{" in spec.target:
                target = render(spec.target, row, spec.key("target"), where)
            elif spec.target in row:
                target = str(row[spec.target])
            else:
                raise TaskError(f"{where}: {spec.key('target')} names field {spec.target!r}, which this row lacks",
                                "fields here: " + ", ".join(map(str, list(row)[:12])))
            return Example(index, prompt, target=target, meta={"line": lineno})
        choices = self.choices_of(row, where)
        return Example(index, prompt, choices=choices, label=self.label_of(row, choices, where), meta={"line": lineno})

    def choices_of(self, row: Mapping[str, Any], where: str) -> tuple[str, ...]:
        spec = self.spec
        if isinstance(spec.choices, tuple):
            return tuple(render(t, row, f"{spec.key('choices')}[{i}]", where) for i, t in enumerate(spec.choices))
        field = str(spec.choices)
        value = row.get(field)
        if isinstance(value, str) and self.path.suffix.lower() in (".csv", ".tsv"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if field not in row:
            raise TaskError(f"{where}: {spec.key('choices')} names field {field!r}, which this row lacks",
                            "fields here: " + ", ".join(map(str, list(row)[:12])))
        if not isinstance(value, list) or len(value) < 2 or not all(isinstance(c, str) for c in value):
            raise TaskError(f"{where}: field {field!r} ({spec.key('choices')}) must be a list of at least two strings, "
                            f"got {json.dumps(value)[:60]}", 'e.g. "choices": [" red", " blue"]')
        return tuple(value)

    def label_of(self, row: Mapping[str, Any], choices: Sequence[str], where: str) -> int:
        key, field = self.spec.key("label"), str(self.spec.label)
        if field not in row:
            raise TaskError(f"{where}: {key} names field {field!r}, which this row lacks",
                            "fields here: " + ", ".join(map(str, list(row)[:12])))
        value = row[field]
        if isinstance(value, bool) and len(choices) == 2:
            return int(value)
        if isinstance(value, str):
            text = value.strip()
            stripped = [c.strip() for c in choices]
            if text.lstrip("-").isdigit():
                value = int(text)
            elif text in stripped and stripped.count(text) == 1:
                return stripped.index(text)
            else:
                raise TaskError(f"{where}: {key} field {field!r} is {value!r}, neither an index nor one of the choices",
                                "use the 0-based index of the right choice")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TaskError(f"{where}: {key} field {field!r} is {json.dumps(value)[:40]}, not a choice index",
                            "use the 0-based index of the right choice")
        if not 0 <= value < len(choices):
            raise TaskError(f"{where}: {key} field {field!r} is {value}, out of range for {len(choices)} choices",
                            f"labels are 0-based: 0..{len(choices) - 1}")
        return value

    def load(self, split: SplitName, size: int | None = None, seed: int = 0, data_dir: Path | None = None) -> Split:
        if split not in ("discovery", "heldout"):
            raise TaskError(f"unknown split {split!r}", "use discovery or heldout")
        rows = self.examples()
        pool = self.default_sizes[0]
        if pool == 0:
            raise TaskError(f"{self.spec.where}: {self.path.name} has {len(rows)} row(s): too few to carve discovery "
                            "and held-out", "add rows (at least two)")
        order = list(range(len(rows)))
        random.Random(f"carve:{seed}").shuffle(order)
        part = order[:pool] if split == "discovery" else order[pool:]
        n = len(part) if size is None else size
        if n > len(part):
            raise TaskError(f"requested {n} {split} examples but {self.path.name} ({len(rows)} rows) is carved "
                            f"{pool} discovery / {len(rows) - pool} held-out", "lower the size or add rows")
        note = (f"one file: discovery ({pool} rows) and held-out ({len(rows) - pool} rows) carved without overlap "
                f"by a seeded shuffle (seed {seed})")
        picked = sorted(part[:n])
        return Split(self.name, split, [rows[i] for i in picked], f"{self.path.name} rows", note)

    def preview(self) -> Example:
        """The file's first row as an example (for `headedit tasks FILE`)."""
        return self.examples()[0]

    def source(self) -> TaskSource:
        spec = self.spec
        fields = {"prompt": spec.prompt, "choices": list(spec.choices) if isinstance(spec.choices, tuple) else spec.choices,
                  "label": spec.label, "target": spec.target}
        return TaskSource("file", self.name, task_file=file_entry(self.task_file) if self.task_file else None,
                          data=(file_entry(self.path),),
                          details={"fields": {k: v for k, v in fields.items() if v is not None}})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "data": self.path.name, "rows": len(self.examples())}


def spec_from_table(table: Mapping[str, Any], where: str, prefix: str = "task.") -> FileSpec:
    """A FileSpec from a TOML [task] table (types checked here, so a task file gets the recipe's messages)."""
    def text(key: str, required: bool = False) -> str | None:
        value = table.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise TaskError(f"{where}: {prefix}{key} must be a non-empty string", f'e.g. {key} = "..."')
        return value

    choices = table.get("choices")
    if choices is not None and not isinstance(choices, str):
        if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) for c in choices):
            raise TaskError(f"{where}: {prefix}choices must be a list of strings or a field name",
                            'e.g. choices = [" no", " yes"] or choices = "options"')
        choices = tuple(choices)
    data = text("data", required=True)
    assert data is not None
    return FileSpec(data=data, prompt=text("prompt") or "", choices=choices, label=text("label"),
                    target=text("target"), where=where, prefix=prefix)


def task_from_toml(path: Path, reference: str) -> FileTask:
    """A task TOML: a [task] table with the shortcut fields (a recipe that has them works too)."""
    import tomllib

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"task file {path} not found", "check the path") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as err:
        raise TaskError(f"task file {path.name}: not valid TOML ({str(err).splitlines()[0]})",
                        "fix the TOML syntax") from None
    table = raw.get("task")
    if not isinstance(table, dict) or "data" not in table:
        raise TaskError(f"task file {path.name} has no [task] table with a data field",
                        'write [task] with data = "FILE.jsonl", prompt = "...", and choices + label or target')
    return FileTask(reference, spec_from_table(table, f"task file {path.name}"), task_file=path)
