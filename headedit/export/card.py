"""Model card of an export: what was edited, measured results, how the heads were found, how to reproduce.

Rendered through huggingface_hub (`ModelCardData`, `EvalResult`, `ModelCard.from_template`) from the
Jinja template `model_cards/headedit.md`, never hand-built YAML. Every figure comes from the run's
files; every string is scrubbed so no local path, local user name or token reaches a public card.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from headedit import __version__
from headedit.atomic import sha256_file, write_bytes_atomic
from headedit.errors import ExportError, RunError
from headedit.export.bake import MANIFEST, read_manifest, verify_export
from headedit.export.card_metadata import (
    HUB_DATASETS,
    ci_text,
    dataset_of,
    eval_results,
    p_text,
    placeholder_repo_id,
    pts,
    repo_name,
    screen_delta,
    screen_quantity,
    versions,
)
from headedit.export.provenance import Provenance, provenance
from headedit.export.removal_card import card_limitations, card_section
from headedit.model.heads import parse_heads

TEMPLATE = "headedit.md"
CARD = "README.md"
HEATMAP = "heads.png"
_TOKEN_RE = re.compile(r"\b(?:hf_|api_org_)[A-Za-z0-9_\-]{8,}")
# Absolute POSIX paths (2+ components), home-relative paths, Windows drive paths and file:// URLs.
_PATH_RE = re.compile(
    r"(?:file://)?(?<![\w:/.\-])/(?:[\w.\-@+]+/)+[\w.\-@+]*"
    r"|(?<![\w])~[\w.\-]*/[^\s\"'`)\]|]*"
    r"|(?<![\w])[A-Za-z]:\\[^\s\"'`)\]|]*"
)


def template_path() -> Path:
    """The card template: packaged as headedit.model_cards, or the repo's model_cards/ folder."""
    try:
        path = resources.files("headedit.model_cards").joinpath(TEMPLATE)
        if path.is_file():
            return Path(str(path))
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / "model_cards" / TEMPLATE


def _secrets() -> list[str]:
    found = [os.environ.get(v, "") for v in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")]
    try:
        from huggingface_hub import get_token

        found.append(get_token() or "")
    except Exception:
        pass
    return [s for s in found if len(s) >= 8]


def scrub(text: str, keep: tuple[str, ...] = ()) -> str:
    """Remove tokens, local paths and the local user name from `text`, leaving the strings in `keep` alone."""
    held = {f"\x00{i}\x00": k for i, k in enumerate(k for k in keep if k)}
    for marker, value in held.items():
        text = text.replace(value, marker)
    for secret in _secrets():
        text = text.replace(secret, "<redacted>")
    text = _TOKEN_RE.sub("<redacted>", text)
    text = _PATH_RE.sub("<local path>", text)
    home = str(Path.home())
    if len(home) > 1:
        text = text.replace(home, "<local path>")
    try:
        user = getpass.getuser()
    except Exception:
        user = ""
    if len(user) >= 2:
        text = re.sub(rf"(?<![\w]){re.escape(user)}(?![\w])", "<user>", text)
    for marker, value in held.items():
        text = text.replace(marker, value)
    return text


def _read_json(path: Path, required: bool = False) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise RunError(f"{path.name} not found in {path.parent.name}",
                           "validate the run first (`headedit validate RUN`)" if path.name == "validation.json" else "re-run discovery")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise RunError(f"{path.name} in {path.parent.name} is corrupt", "re-run the step that writes it") from None
    if not isinstance(data, dict):
        raise RunError(f"{path.name} in {path.parent.name} is not an object", "re-run the step that writes it")
    return data


def _pct(x: Any) -> str:
    return f"{100 * float(x):.2f}%" if isinstance(x, (int, float)) else "n/a"


def _rer(validation: dict[str, Any]) -> str:
    rer = validation.get("relative_error_reduction")
    return f"{100 * float(rer):.1f}%" if isinstance(rer, (int, float)) else "n/a"


def _row(v: dict[str, Any]) -> dict[str, str]:
    return {"task": str(v.get("task", "?")), "intact": _pct(v.get("intact_acc")), "edited": _pct(v.get("edited_acc")),
            "gain": pts(v.get("gain_points")), "rer": _rer(v), "n": str(v.get("n", "n/a")),
            "ci": ci_text(v.get("ci95_points")), "p": p_text(v.get("mcnemar_p"))}


def _method(run: dict | None, screen: dict | None, search: dict | None, selection: dict | None,
            validation: dict) -> list[str]:
    task = (run or {}).get("task") or {}
    lines, total = [], 0
    if screen:
        total += int(screen.get("evaluations") or 0)
        lines.append(f"Screen: `{screen.get('method', '?')}` over all {screen.get('num_layers', '?')} x "
                     f"{screen.get('num_heads', '?')} heads on the discovery split of {validation.get('task')} "
                     f"(n={screen.get('n') or task.get('discovery_n', 'n/a')}, seed {task.get('seed', 'n/a')}), "
                     f"{screen.get('evaluations', 'n/a')} evaluations; rule: {screen.get('rule', 'n/a')}.")
    if search:
        trace = search.get("trace") or []
        sizes = sorted({int(t["size"]) for t in trace if isinstance(t, dict) and isinstance(t.get("size"), int)})
        total += int(search.get("evaluations") or 0)
        rows = f" on {selection['n']} other discovery rows" if selection and selection.get("screen_rows") else ""
        lines.append(f"Search{rows}: {search.get('rule', 'n/a')}; {len(trace)} steps, set sizes {sizes or 'n/a'}, "
                     f"{search.get('evaluations', 'n/a')} evaluations.")
    if selection:
        lines.append(f"Selected: `{selection.get('heads', '')}`, discovery accuracy {_pct(selection.get('intact_acc'))}"
                     f" -> {_pct(selection.get('discovery_acc'))} ({pts(selection.get('gain_points'))} points).")
    lines.append(f"Held-out check: n={validation.get('n', 'n/a')} examples of the {validation.get('split', 'heldout')} "
                 "split, disjoint from the discovery examples; paired bootstrap 95% interval and exact McNemar test.")
    if total:
        lines.append(f"Total evaluations of head sets on discovery data: {total}.")
    if task.get("data_note"):
        lines.append(f"Data: {task['data_note']}")
    return lines


def damage_line(validation: dict[str, Any]) -> str | None:
    """The general-damage check in words (KL of the edited from the intact next-token distribution)."""
    damage = validation.get("damage")
    if not isinstance(damage, dict) or not isinstance(damage.get("kl_mean"), (int, float)):
        return None
    return (f"General damage: mean {damage.get('direction', 'KL(intact || edited)')} of the next-token distributions "
            f"of the intact and the edited model on {damage.get('tokens', 'n/a')} tokens of neutral English text "
            f"({damage.get('source', 'n/a')}): "
            f"{float(damage['kl_mean']):.4f} nats per token (largest single token "
            f"{float(damage.get('kl_max', 0.0)):.3f}); 0 means the edit left those predictions unchanged.")


def _limitations(validation: dict[str, Any], side: list[dict[str, Any]]) -> list[str]:
    lines = [(f"The gain is specific to {validation.get('task')}: {pts(validation.get('gain_points'))} points on "
              f"n={validation.get('n')} held-out examples (95% CI {ci_text(validation.get('ci95_points'))} points). "
              "Held-out gains are per task; do not expect them on other tasks.")]
    for s in side:
        g = s.get("gain_points")
        trend = "degraded" if isinstance(g, (int, float)) and g < 0 else "changed"
        lines.append(f"{s.get('task')} {trend}: {_pct(s.get('intact_acc'))} -> {_pct(s.get('edited_acc'))} "
                     f"({pts(g)} points, 95% CI {ci_text(s.get('ci95_points'))}, n={s.get('n')}).")
    if not side:
        lines.append("No other task was measured: other capabilities may have degraded by an unknown amount.")
    lines.append("Zeroed heads are removed for every input, not just for this task; no weights were trained.")
    return lines


def _source_model_id(where: Path, export: Path, manifest: dict[str, Any]) -> tuple[str | None, bool]:
    """(model id, whether it is a Hub id): the manifest's Hub source, else the recipe's model id (a local
    folder's full path, which the manifest does not keep)."""
    source = manifest.get("source") or {}
    if source.get("hub") and source.get("id"):
        return str(source["id"]), True
    for folder in (where, export):
        recipe = folder / "recipe.toml"
        if recipe.is_file():
            try:
                model_id = tomllib.loads(recipe.read_text(encoding="utf-8")).get("model", {}).get("id")
            except (tomllib.TOMLDecodeError, AttributeError):
                model_id = None
            if isinstance(model_id, str) and model_id:
                return model_id, False
    return (str(source["id"]) if source.get("id") else None), False


def _without_task_paths(validation: dict[str, Any]) -> dict[str, Any]:
    """validation.json with task names that are file paths shortened to the file name (cards are public)."""
    def name(value: Any) -> Any:
        text = str(value)
        return Path(text.partition("#")[0]).name + ("#" + text.partition("#")[2] if "#" in text else "") \
            if ("/" in text or "\\" in text) else value

    out = dict(validation)
    out["task"] = name(out.get("task", "task"))
    out["side_tasks"] = [{**s, "task": name(s.get("task"))} if isinstance(s, dict) else s
                         for s in out.get("side_tasks") or []]
    return out


def render_card(export_dir: str | Path, run_dir: str | Path | None = None, repo_id: str | None = None) -> Any:
    """Build the ModelCard of an export from its manifest and the run's files (validation.json is required)."""
    from huggingface_hub import ModelCard, ModelCardData

    export = Path(export_dir)
    manifest = read_manifest(export)
    where = Path(run_dir) if run_dir is not None else export
    found = _read_json(where / "validation.json", required=True)
    assert found is not None
    validation = _without_task_paths(found)  # a task file is named by its file name, never its folder
    run = _read_json(where / "run.json")
    screen, search, selection = (_read_json(where / n) for n in ("screen.json", "search.json", "selection.json"))
    recipe_file = where / "recipe.toml" if (where / "recipe.toml").is_file() else export / "recipe.toml"
    recipe = recipe_file.read_text(encoding="utf-8").rstrip() if recipe_file.is_file() else "# no recipe recorded"

    model_id, is_hub = _source_model_id(where, export, manifest)
    origin: Provenance = provenance(model_id, is_hub, (manifest.get("source") or {}).get("revision"), export)
    source_id = str((manifest.get("source") or {}).get("id") or "unknown model")
    layout = manifest.get("layout") or {}
    heads_text = str(manifest.get("heads", ""))
    heads = parse_heads(heads_text) if heads_text else ()
    task = str(validation.get("task", "task"))
    source = validation.get("task_source")
    task_file = source.get("task_file") if isinstance(source, dict) and isinstance(source.get("task_file"), dict) \
        else None
    split = str(validation.get("split", "heldout"))
    side = [s for s in validation.get("side_tasks") or [] if isinstance(s, dict)]
    short = (origin.base_model or source_id).rstrip("/").split("/")[-1]
    model_name = repo_id.split("/")[-1] if repo_id else repo_name(f"{short}-headedit-{task}")
    target = repo_id or placeholder_repo_id(model_name)
    datasets = sorted({d for d, _ in (dataset_of(r) for r in [validation, *side]) if d})
    removal = card_section(validation)  # direction = "remove": the card says what was removed and what was retained

    card_data = ModelCardData(
        base_model=origin.base_model, base_model_relation="finetune" if origin.base_model else None,
        library_name="transformers", pipeline_tag="text-generation", license=origin.license,
        datasets=datasets or None, tags=["headedit", "head-ablation", task] + (["capability-removal"] if removal else []),
        model_name=model_name,
        eval_results=[r for row in [validation, *side] for r in eval_results(row, split)],
    )
    delta = (screen or {}).get("delta")
    delta_at = {}
    if isinstance(delta, list):
        for layer, row in enumerate(delta):
            for head, value in enumerate(row if isinstance(row, list) else []):
                delta_at[(layer, head)] = value
    n_layers = layout.get("num_layers") or (screen or {}).get("num_layers")
    n_heads = layout.get("num_heads") or (screen or {}).get("num_heads")
    total_heads = n_layers * n_heads if isinstance(n_layers, int) and isinstance(n_heads, int) else "n/a"
    base_text = f"[`{origin.base_model}`](https://huggingface.co/{origin.base_model})" if origin.base_model \
        else f"a model without a known Hub id (`{short}`)"
    failed = not removal and validation.get("passed") is not True  # a forced export: say so before anything else
    summary = (
        (f"**Validation did not pass** ({validation.get('verdict', 'no verdict')}); this export was forced "
         "(`headedit export --force`), and nothing shows the edit improves the task. " if failed else "")
        + f"This checkpoint is {base_text} with {len(heads)} attention head(s) zeroed ({heads_text or 'none'}), "
        f"found by headedit {'to remove the capability' if removal else 'for the task'} {task}. Each head's columns of its layer's attention output projection "
        f"(`o_proj.weight[:, h*d:(h+1)*d]`, d = {layout.get('head_dim', 'head_dim')}) are set to zero, which removes "
        "that head's contribution for every input; no weight was trained and no shape changed. "
        f"On held-out data, accuracy went from {_pct(validation.get('intact_acc'))} to "
        f"{_pct(validation.get('edited_acc'))} ({pts(validation.get('gain_points'))} points)."
        + (f" The task is defined by the file `{task_file.get('file')}` (sha256 `{task_file.get('sha256')}`)."
           if task_file else "")
    )
    files = manifest.get("files") or {}
    weights = sorted((n, d) for n, d in files.items() if n.endswith(".safetensors"))
    source_weights = sorted(((manifest.get("source") or {}).get("files") or {}).items())
    packages, environment = versions(run)
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path()),
        title=f"{short}, {len(heads)} head(s) ablated {'to remove' if removal else 'for'} {task}", removal=removal,
        summary=summary, split=split, results=[_row(validation)], verdict=str(validation.get("verdict", "n/a")),
        damage=damage_line(validation), side_effects=[_row(s) for s in side], heads_count=len(heads),
        total_heads=total_heads,
        heads_list=[{"layer": h.layer, "head": h.head,
                     "delta": screen_delta(delta_at.get((h.layer, h.head)), screen)} for h in heads],
        heatmap=bool(delta_at), screen_unit=str((screen or {}).get("unit", "points")),
        screen_what=screen_quantity(screen or {}),
        screen_objective=str((screen or {}).get("objective") or "accuracy"),
        discovery_n=(screen or {}).get("n") or ((run or {}).get("task") or {}).get("discovery_n", "n/a"),
        method=_method(run, screen, search, selection, validation), repo_id=target, placeholder=repo_id is None,
        base_model=origin.base_model, base_from=origin.base_from, license=origin.license,
        license_from=origin.license_from, limitations=card_limitations(validation, side) or _limitations(validation, side),
        recipe=recipe,
        versions=packages, environment=environment,
        weight_hashes=weights + [(f"source: {n}", d) for n, d in source_weights],
        headedit_version=manifest.get("headedit_version", __version__),
    )
    keep = tuple(x for x in (target, origin.base_model, source_id if is_hub else None) if x)
    return ModelCard(scrub(str(card), keep=keep))


def _heatmap(export: Path, where: Path, manifest: dict[str, Any]) -> bool:
    """Write heads.png from the run's screen; False when there is no screen to draw."""
    from headedit.export.heatmap_png import render_heatmap_png  # matplotlib: only when a card is written

    screen = _read_json(where / "screen.json")
    delta = (screen or {}).get("delta")
    if not (isinstance(delta, list) and delta and all(isinstance(r, list) for r in delta)):
        return False
    heads_text = str(manifest.get("heads", ""))
    ablated = [(h.layer, h.head) for h in parse_heads(heads_text)] if heads_text else []
    validation = _read_json(where / "validation.json") or {}
    run = _read_json(where / "run.json") or {}
    selection = _read_json(where / "selection.json") or {}
    n = (screen or {}).get("n") or (run.get("task") or {}).get("discovery_n") or selection.get("n")
    complete = (screen or {}).get("complete")
    png = render_heatmap_png(delta, ablated, task=str(validation.get("task", "")), n=n if isinstance(n, int) else None,
                             method=str((screen or {}).get("method", "single")),
                             unit=str((screen or {}).get("unit", "points")), objective=str((screen or {}).get("objective") or "accuracy"),
                             complete=complete if isinstance(complete, list) else None)
    write_bytes_atomic(export / HEATMAP, png)
    return True


def _rehash(export: Path, manifest: dict[str, Any], written: list[str], repo_id: str) -> dict[str, Any]:
    files = dict(manifest.get("files") or {})
    for name in written:
        files[name] = sha256_file(export / name)
    manifest = {**manifest, "files": dict(sorted(files.items())), "card": {"repo_id": repo_id}}
    write_bytes_atomic(export / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))
    return manifest


def write_card(export_dir: str | Path, run_dir: str | Path | None = None, repo_id: str | None = None) -> Path:
    """Write README.md (and heads.png, recipe.toml, validation.json from the run) into a verified export.

    The manifest's file hashes are extended to the written files, so `push` re-verifies them too; it also
    records the repo id the card names (`card.repo_id`), so `push --repo` can re-render it for another repo.
    """
    export = Path(export_dir)
    manifest = verify_export(export)
    written: list[str] = []
    if run_dir is not None:
        run = Path(run_dir)
        validation = _read_json(run / "validation.json", required=True)
        assert validation is not None
        want = str(manifest.get("heads_added", manifest.get("heads", "")))
        if str(validation.get("heads", want)) != want:
            raise ExportError(f"the run validated heads {validation.get('heads')!r} but the export ablates {want!r}",
                              "bake the run's validated heads, or validate this head set")
        for name in ("recipe.toml", "validation.json"):
            if (run / name).is_file():  # published with the model: scrubbed like the card
                write_bytes_atomic(export / name, scrub((run / name).read_text(encoding="utf-8")).encode("utf-8"))
                written.append(name)
    card = render_card(export, run_dir, repo_id)
    if _heatmap(export, Path(run_dir) if run_dir is not None else export, manifest):
        written.append(HEATMAP)
    write_bytes_atomic(export / CARD, str(card).encode("utf-8"))
    written.append(CARD)
    named = repo_id or _named_repo(str(card))
    _rehash(export, manifest, written, named)
    return export / CARD


def _named_repo(card_text: str) -> str:
    found = re.search(r'from_pretrained\("([^"]+)"\)', card_text)
    return found.group(1) if found else ""


def retarget(card_bytes: bytes, manifest: dict[str, Any], repo_id: str) -> tuple[bytes, bytes] | None:
    """(card, manifest) bytes whose card names `repo_id` (usage snippet, model-index name), or None when the card
    already does. `push --repo` uploads these instead of the files on disk, so the export folder is never left
    half-rewritten (a killed push changes nothing locally); only the repo id changes, every figure stays."""
    from huggingface_hub import ModelCard, ModelCardData

    text = card_bytes.decode("utf-8")
    old = str((manifest.get("card") or {}).get("repo_id") or _named_repo(text))
    if not old or old == repo_id:
        return None
    text = text.replace(f"\n{_placeholder_note(old)}\n", "\n")
    card = ModelCard(text.replace(f'"{old}"', f'"{repo_id}"').replace(f"`{old}`", f"`{repo_id}`"))
    assert isinstance(card.data, ModelCardData)
    card.data.model_name = repo_id.split("/")[-1]  # the model-index name is re-serialised from it
    new_card = str(card).encode("utf-8")
    files = {**(manifest.get("files") or {}), CARD: hashlib.sha256(new_card).hexdigest()}
    new_manifest = {**manifest, "files": dict(sorted(files.items())), "card": {"repo_id": repo_id}}
    return new_card, (json.dumps(new_manifest, indent=2) + "\n").encode("utf-8")


def _placeholder_note(old: str) -> str:
    """The template's line under the usage snippet when it names a placeholder repo (dropped on retarget)."""
    return (f"`{old}` is a placeholder: `headedit push EXPORT --repo NAMESPACE/NAME` uploads this card with that repo "
            "here.")


__all__ = ["render_card", "write_card", "retarget", "scrub", "template_path", "placeholder_repo_id",
           "repo_name", "dataset_of", "damage_line", "HUB_DATASETS"]
