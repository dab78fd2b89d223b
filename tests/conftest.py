"""Shared test set-up. Keep tests offline: nothing here may reach a real hub.

Do not import huggingface_hub or transformers at the top of this file: the hub plugin below sets
HF_ENDPOINT (the local test server) before anything reads it.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["hub.fixtures"]
