"""The checkpoints shipped inside the package (`headedit:demo`, `headedit:addsub`): ids and where their files lie.

Found as package data under `headedit/demo/`, without importing the demo's code, so loading a model never
imports a task module.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

from headedit.errors import ModelNotFoundError

DEMO_ID = "headedit:demo"
ADDSUB_ID = "headedit:addsub"  # the add/sub demo with planted heads (headedit/demo/addsub.py)
# id -> (folder under headedit/demo, label, module that retrains it)
BUNDLED = {
    DEMO_ID: ("model", "demo", "headedit.demo.train"),
    ADDSUB_ID: ("addsub_model", "add/sub demo", "headedit.demo.addsub"),
}


def bundled_model_path(model_id: str) -> Path:
    """The committed folder (config, tokenizer, model.safetensors) of a bundled id; the error names the script
    that retrains it when files are missing."""
    folder, label, script = BUNDLED[model_id]
    path: Path | None = None
    try:
        candidate = importlib.resources.files("headedit") / "demo" / folder
        if isinstance(candidate, Path):
            path = candidate
    except (ModuleNotFoundError, TypeError):
        path = None
    if path is None or not (path / "config.json").is_file():
        path = Path(__file__).resolve().parent.parent / "demo" / folder
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ModelNotFoundError(
            f"the bundled {label} model is missing from {path}",
            f"reinstall headedit, or retrain it with `python -m {script} OUT`",
        )
    return path
