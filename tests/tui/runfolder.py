"""A small run folder in the contract's formats (docs/contracts.md), for screens that read finished runs."""
from __future__ import annotations

import json
from pathlib import Path

RECIPE = """name = "snap"

[model]
id = "headedit:demo"
dtype = "float32"
device = "cpu"

[task]
name = "copy-second"
discovery = 200
heldout = 400

[discovery]
candidates = 4
max_heads = 2

[validation]
side_tasks = ["copy-first"]
"""

DELTA = [[-1.5, 42.0, 0.0, -80.5], [3.0, -0.5, 12.25, 0.0]]  # [layer][head] points


def write_run(path: Path, validated: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "recipe.toml").write_text(RECIPE)
    (path / "run.json").write_text(json.dumps({"format": 1, "name": "snap", "created": "2025-01-01T00:00:00+00:00",
                                               "model": {"id": "headedit:demo"}}))
    (path / "screen.json").write_text(json.dumps({
        "method": "single", "rule": "top-k by delta", "num_layers": 2, "num_heads": 4, "intact_acc": 0.03,
        "delta": DELTA, "evaluations": 9}))
    (path / "search.json").write_text(json.dumps({"rule": "greedy beam 2", "evaluations": 7, "trace": [
        {"heads": "0.1", "size": 1, "acc": 0.45, "gain": 42.0},
        {"heads": "0.1,1.2", "size": 2, "acc": 0.97, "gain": 94.0},
        {"heads": "0.1,1.0", "size": 2, "acc": 0.50, "gain": 47.0},
        {"heads": "0.1,0.3", "size": 2, "acc": 0.0625, "gain": 3.1, "n": 64, "pruned": True},
    ]}))
    (path / "selection.json").write_text(json.dumps({"heads": "0.1,1.2", "discovery_acc": 0.97, "intact_acc": 0.03,
                                                     "gain_points": 94.0, "n": 200}))
    if validated:
        (path / "validation.json").write_text(json.dumps({
            "task": "copy-second", "dataset_id": None, "split": "heldout", "metric": "acc", "n": 400,
            "heads": "0.1,1.2", "intact_acc": 0.025, "edited_acc": 0.985, "gain_points": 96.0,
            "relative_error_reduction": 0.985, "ci95_points": [94.1, 97.6], "mcnemar_p": 1e-300, "passed": True,
            "verdict": "gain held on held-out: +96.0 points, 95% CI [94.1, 97.6], McNemar p<1e-300",
            "side_tasks": [{"task": "copy-first", "dataset_id": None, "metric": "acc", "n": 400, "intact_acc": 0.97,
                            "edited_acc": 0.02, "gain_points": -95.0, "ci95_points": [-97.0, -92.8],
                            "mcnemar_p": 1e-300}]}))
    return path
