"""The pipeline's stages as entry points, for the CLI, the TUI and Python users alike.

`discover` (single- or multi-process, chosen inside), `validate`, `export`, `run` (all three), and hand-made
sets (`evaluate_set`, `select`). Importing this package does not import torch; loading a model does.
"""
from __future__ import annotations

from headedit.pipeline.discover import discover
from headedit.pipeline.export import export_run as export
from headedit.pipeline.loaded import Loaded, load_for, load_split
from headedit.pipeline.manual import evaluate_set, release, select
from headedit.pipeline.run import run
from headedit.pipeline.validate import validate_run as validate

__all__ = ["discover", "validate", "export", "run", "evaluate_set", "select", "release",
           "Loaded", "load_for", "load_split"]
