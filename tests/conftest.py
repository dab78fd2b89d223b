"""Shared test set-up. Keep tests offline: nothing here may reach a real hub.

Do not import huggingface_hub or transformers at the top of this file: the hub plugin below sets
HF_ENDPOINT (the local test server) before anything reads it.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread everywhere (this process and every CLI subprocess), so logits computed in-process and in a
# subprocess use the same kernels and compare bit for bit.
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402  (torch does not read HF_ENDPOINT; the hub plugin below still runs first for HF libs)

torch.set_num_threads(1)

pytest_plugins = ["hub.fixtures"]
