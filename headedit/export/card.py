"""Model card of an export: what was edited, measured results, how the heads were found, how to reproduce.

Rendered through huggingface_hub (`ModelCardData`, `EvalResult`, `ModelCard.from_template`) from the
Jinja template `model_cards/headedit.md`, never hand-built YAML. Every figure comes from the run's
files; every string is scrubbed so no local path, local user name or token reaches a public card.
"""
from __future__ import annotations

import getpass
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

from headedit import __version__
from headedit.atomic import sha256_file, write_bytes_atomic
from headedit.errors import ExportError, RunError
from headedit.export.bake import MANIFEST, read_manifest, verify_export
from headedit.export.heatmap_png import encode_png, heatmap_rgb
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


def _pts(x: Any) -> str:
    return f"{float(x):+.2f}" if isinstance(x, (int, float)) else "n/a"


def _ci(ci: Any) -> str:
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"
    return "n/a"


def _p(p: Any) -> str:
    if not isinstance(p, (int, float)):
        return "n/a"
    if p < 1e-300:
        return "<1e-300"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def _rer(validation: dict[str, Any]) -> str:
    rer = validation.get("relative_error_reduction")
    return f"{100 * float(rer):.1f}%" if isinstance(rer, (int, float)) else "n/a"


def _row(v: dict[str, Any]) -> dict[str, str]:
    return {"task": str(v.get("task", "?")), "intact": _pct(v.get("intact_acc")), "edited": _pct(v.get("edited_acc")),
            "gain": _pts(v.get("gain_points")), "rer": _rer(v), "n": str(v.get("n", "n/a")),
            "ci": _ci(v.get("ci95_points")), "p": _p(v.get("mcnemar_p"))}


def _source(manifest: dict[str, Any]) -> tuple[str, bool]:
    source = manifest.get("source") or {}
    sid = str(source.get("id") or "unknown model")
    return sid, bool(source.get("hub")) and "/" in sid and not sid.startswith(("/", ".", "~"))


def _source_license(source_id: str, is_hub: bool, revision: str | None) -> str | None:
    """The source card's licence, when the source is a hub model whose card can be read."""
    if not is_hub:
        return None
    try:
        from huggingface_hub import ModelCard

        data = ModelCard.load(source_id, repo_type="model").data
        lic = data.get("license")
        return str(lic) if isinstance(lic, str) and lic else None
    except Exception:
        return None  # offline, gated or no card: leave the licence unset rather than guess


def _eval_result(v: dict[str, Any], split: str) -> Any:
    from huggingface_hub import EvalResult

    task = str(v.get("task", "task"))
    return EvalResult(
        task_type="text-generation", task_name=task,
        dataset_type=str(v.get("dataset_id") or f"headedit/{task}"), dataset_name=task, dataset_split=split,
        metric_type="accuracy" if v.get("metric", "acc") in ("acc", "accuracy") else str(v.get("metric")),
        metric_value=round(float(v.get("edited_acc", 0.0)), 6), metric_name=f"{task} accuracy (edited)",
    )


def _versions(run: dict[str, Any] | None) -> list[tuple[str, str]]:
    env = (run or {}).get("environment") or {}
    if not env:
        import importlib.metadata as md
        import platform

        env = {"python": platform.python_version()}
        for pkg in ("headedit", "torch", "transformers", "safetensors", "huggingface-hub", "tokenizers"):
            try:
                env[pkg] = md.version(pkg)
            except md.PackageNotFoundError:
                pass
    return sorted((str(k), str(v)) for k, v in env.items())


def _method(run: dict | None, screen: dict | None, search: dict | None, selection: dict | None,
            validation: dict) -> list[str]:
    task = (run or {}).get("task") or {}
    lines, total = [], 0
    if screen:
        total += int(screen.get("evaluations") or 0)
        lines.append(f"Screen: `{screen.get('method', '?')}` over all {screen.get('num_layers', '?')} x "
                     f"{screen.get('num_heads', '?')} heads on the discovery split of {validation.get('task')} "
                     f"(n={task.get('discovery_n', 'n/a')}, seed {task.get('seed', 'n/a')}), "
                     f"{screen.get('evaluations', 'n/a')} evaluations; rule: {screen.get('rule', 'n/a')}.")
    if search:
        trace = search.get("trace") or []
        sizes = sorted({int(t["size"]) for t in trace if isinstance(t, dict) and isinstance(t.get("size"), int)})
        total += int(search.get("evaluations") or 0)
        lines.append(f"Search: {search.get('rule', 'n/a')}; {len(trace)} steps, set sizes {sizes or 'n/a'}, "
                     f"{search.get('evaluations', 'n/a')} evaluations.")
    if selection:
        lines.append(f"Selected: `{selection.get('heads', '')}`, discovery accuracy {_pct(selection.get('intact_acc'))}"
                     f" -> {_pct(selection.get('discovery_acc'))} ({_pts(selection.get('gain_points'))} points).")
    lines.append(f"Held-out check: n={validation.get('n', 'n/a')} examples of the {validation.get('split', 'heldout')} "
                 "split, disjoint from the discovery examples; paired bootstrap 95% interval and exact McNemar test.")
    if total:
        lines.append(f"Total evaluations of head sets on discovery data: {total}.")
    if task.get("data_note"):
        lines.append(f"Data: {task['data_note']}")
    return lines


def _limitations(validation: dict[str, Any], side: list[dict[str, Any]]) -> list[str]:
    lines = [f"The gain is specific to {validation.get('task')}: {_pts(validation.get('gain_points'))} points on "
             f"n={validation.get('n')} held-out examples (95% CI {_ci(validation.get('ci95_points'))} points). "
             "Held-out gains are per task; do not expect them on other tasks."]
    for s in side:
        g = s.get("gain_points")
        trend = "degraded" if isinstance(g, (int, float)) and g < 0 else "changed"
        lines.append(f"{s.get('task')} {trend}: {_pct(s.get('intact_acc'))} -> {_pct(s.get('edited_acc'))} "
                     f"({_pts(g)} points, 95% CI {_ci(s.get('ci95_points'))}, n={s.get('n')}).")
    if not side:
        lines.append("No other task was measured: other capabilities may have degraded by an unknown amount.")
    lines.append("Zeroed heads are removed for every input, not just for this task; no weights were trained.")
    return lines


def render_card(export_dir: str | Path, run_dir: str | Path | None = None, repo_id: str | None = None) -> Any:
    """Build the ModelCard of an export from its manifest and the run's files (validation.json is required)."""
    from huggingface_hub import ModelCard, ModelCardData

    export = Path(export_dir)

    manifest = read_manifest(export)
    where = Path(run_dir) if run_dir is not None else export
    validation = _read_json(where / "validation.json", required=True)
    assert validation is not None
    run = _read_json(where / "run.json")
    screen, search, selection = (_read_json(where / n) for n in ("screen.json", "search.json", "selection.json"))
    recipe_file = where / "recipe.toml" if (where / "recipe.toml").is_file() else export / "recipe.toml"
    recipe = recipe_file.read_text(encoding="utf-8").rstrip() if recipe_file.is_file() else "# no recipe recorded"

    source_id, is_hub = _source(manifest)
    layout = manifest.get("layout") or {}
    heads_text = str(manifest.get("heads", ""))
    heads = parse_heads(heads_text) if heads_text else ()
    task = str(validation.get("task", "task"))
    split = str(validation.get("split", "heldout"))
    side = [s for s in validation.get("side_tasks") or [] if isinstance(s, dict)]
    short = source_id.rstrip("/").split("/")[-1]
    model_name = repo_id.split("/")[-1] if repo_id else f"{short}-headedit-{task}"

    card_data = ModelCardData(
        base_model=source_id if is_hub else None,
        library_name="transformers",
        pipeline_tag="text-generation",
        license=_source_license(source_id, is_hub, (manifest.get("source") or {}).get("revision")),
        tags=["headedit", "head-ablation", task],
        model_name=model_name,
        eval_results=[_eval_result(validation, split)] + [_eval_result(s, split) for s in side],
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
    base_text = f"`{source_id}`" if is_hub else f"a local model (`{short}`)"
    summary = (
        f"This checkpoint is {base_text} with {len(heads)} attention head(s) zeroed ({heads_text or 'none'}), "
        f"found by headedit for the task {task}. Each head's columns of its layer's attention output projection "
        f"(`o_proj.weight[:, h*d:(h+1)*d]`, d = {layout.get('head_dim', 'head_dim')}) are set to zero, which removes "
        "that head's contribution for every input; no weight was trained and no shape changed. "
        f"On held-out data, accuracy went from {_pct(validation.get('intact_acc'))} to "
        f"{_pct(validation.get('edited_acc'))} ({_pts(validation.get('gain_points'))} points)."
    )
    files = manifest.get("files") or {}
    weights = sorted((n, d) for n, d in files.items() if n.endswith(".safetensors"))
    source_weights = sorted(((manifest.get("source") or {}).get("files") or {}).items())
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path()),
        title=f"{short}, {len(heads)} head(s) ablated for {task}",
        summary=summary, split=split, results=[_row(validation)], verdict=str(validation.get("verdict", "n/a")),
        side_effects=[_row(s) for s in side], heads_count=len(heads), total_heads=total_heads,
        heads_list=[{"layer": h.layer, "head": h.head,
                     "delta": _pts(delta_at[(h.layer, h.head)]) if (h.layer, h.head) in delta_at else None} for h in heads],
        heatmap=bool(delta_at), heatmap_scale=f"{max((abs(float(v)) for v in delta_at.values()), default=0.0):.2f}",
        method=_method(run, screen, search, selection, validation), repo_id=repo_id or "YOUR_NAMESPACE/" + model_name,
        limitations=_limitations(validation, side), recipe=recipe, versions=_versions(run),
        weight_hashes=weights + [(f"source: {n}", d) for n, d in source_weights],
        headedit_version=manifest.get("headedit_version", __version__),
    )
    keep = tuple(x for x in (repo_id, source_id if is_hub else None) if x)
    return ModelCard(scrub(str(card), keep=keep))


def write_card(export_dir: str | Path, run_dir: str | Path | None = None, repo_id: str | None = None) -> Path:
    """Write README.md (and heads.png, recipe.toml, validation.json from the run) into a verified export.

    The manifest's file hashes are extended to the written files, so `push` re-verifies them too.
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
    screen = _read_json((Path(run_dir) if run_dir is not None else export) / "screen.json")
    delta = (screen or {}).get("delta")
    if isinstance(delta, list) and delta and all(isinstance(r, list) for r in delta):
        heads_text = str(manifest.get("heads", ""))
        ablated = [(h.layer, h.head) for h in parse_heads(heads_text)] if heads_text else []
        write_bytes_atomic(export / HEATMAP, encode_png(heatmap_rgb(delta, ablated)))
        written.append(HEATMAP)
    write_bytes_atomic(export / CARD, str(card).encode("utf-8"))
    written.append(CARD)
    files = dict(manifest.get("files") or {})
    for name in written:
        files[name] = sha256_file(export / name)
    manifest["files"] = dict(sorted(files.items()))
    write_bytes_atomic(export / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))
    return export / CARD


__all__ = ["render_card", "write_card", "scrub", "template_path"]
