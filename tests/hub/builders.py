"""Build a real tiny export and a run folder (files per docs/contracts.md) for card and push tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HEADS = "0.1,1.2"
RECIPE = """# headedit recipe for the card/push tests
name = "tiny-copy"

[model]
id = "{model}"

[task]
name = "copy-second"
discovery_n = 64
heldout_n = 128
seed = 7
"""


def make_source(folder: Path) -> Path:
    """A random-weight tiny Llama + tokenizer saved as safetensors (the 'source model')."""
    from headedit.bench.tiny import tiny_model, tiny_tokenizer

    model = tiny_model("llama", seed=3)
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def make_run(folder: Path, source: Path, heads: str = HEADS, passed: bool = True) -> Path:
    """A run folder with the files `headedit discover`/`validate` write, holding plausible fixed numbers."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.toml").write_text(RECIPE.format(model=source), encoding="utf-8")
    (folder / "run.json").write_text(json.dumps({
        "format": 1, "headedit_version": "0.1.0", "name": "tiny-copy", "created": "2025-01-01T00:00:00Z",
        "model": {"id": str(source), "revision": None, "sha256": {}},
        "environment": {"torch": "2.13.0", "transformers": "5.24.0", "device": "cpu", "python": "3.11.7"},
        "task": {"name": "copy-second", "discovery_n": 64, "heldout_n": 128, "seed": 7,
                 "data_note": f"synthetic copy task generated locally (cache {source})"},
    }), encoding="utf-8")
    delta = np.zeros((2, 4))
    delta[0, 1], delta[1, 2], delta[1, 0] = 12.5, 6.25, -9.0
    (folder / "screen.json").write_text(json.dumps({
        "method": "single", "rule": "keep heads whose ablation gains >= 1 point", "num_layers": 2, "num_heads": 4,
        "intact_acc": 0.25, "delta": delta.tolist(), "evaluations": 9}), encoding="utf-8")
    (folder / "search.json").write_text(json.dumps({
        "rule": "greedy forward selection", "evaluations": 5,
        "trace": [{"heads": "0.1", "size": 1, "acc": 0.375, "gain": 12.5},
                  {"heads": "0.1,1.2", "size": 2, "acc": 0.4375, "gain": 18.75}]}), encoding="utf-8")
    (folder / "selection.json").write_text(json.dumps({
        "heads": heads, "discovery_acc": 0.4375, "intact_acc": 0.25, "gain_points": 18.75}), encoding="utf-8")
    (folder / "validation.json").write_text(json.dumps({
        "task": "copy-second", "dataset_id": None, "split": "heldout", "metric": "acc", "n": 128, "heads": heads,
        "intact_acc": 0.25, "edited_acc": 0.40625, "gain_points": 15.625, "relative_error_reduction": 0.2083,
        "ci95_points": [7.8, 23.4], "mcnemar_p": 0.00042, "passed": passed,
        "verdict": "gain held on held-out: +15.6 points, 95% CI [7.8, 23.4], McNemar p=0.00042" if passed
        else "gain did not hold on held-out",
        "side_tasks": [{"task": "copy-first", "dataset_id": None, "metric": "acc", "n": 128, "intact_acc": 0.5,
                        "edited_acc": 0.4375, "gain_points": -6.25, "ci95_points": [-12.5, -0.8],
                        "mcnemar_p": 0.031}]}), encoding="utf-8")
    return folder


def make_export(root: Path, heads: str = HEADS, passed: bool = True, card: bool = True) -> tuple[Path, Path, Path]:
    """(source, run, export): bake `heads` of a tiny source, then write the card from the run into the export."""
    from headedit.export.bake import bake

    source = make_source(root / "source")
    run = make_run(root / "run", source, heads, passed)
    export = bake(source, heads, root / "export")
    bind_validation(run, export)
    if card:
        from headedit.export.card import write_card

        write_card(export, run)
    return source, run, export


def bind_validation(run: Path, export: Path) -> None:
    """Record in the run's validation.json the checkpoint it vouches for, as `headedit validate` does from the
    checkpoint it bakes and reloads (bake is reproducible, so that is this export's manifest)."""
    from headedit.export.bake import read_manifest
    from headedit.export.outgoing import checkpoint_record

    validation = json.loads((run / "validation.json").read_text())
    validation["checkpoint"] = checkpoint_record(read_manifest(export))
    (run / "validation.json").write_text(json.dumps(validation), encoding="utf-8")
