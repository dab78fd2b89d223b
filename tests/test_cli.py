"""The CLI's front door: bake and inspect end to end, bad input as one line with exit 2, and lazy imports
(no textual for the library, no torch before a recipe error)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testkit.models import family_model, save_model


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "headedit", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


@pytest.fixture(scope="module")
def cli_src(tmp_path_factory):
    return save_model(family_model("llama"), tmp_path_factory.mktemp("cli") / "src")


def test_cli_bake_and_inspect(cli_src, tmp_path):
    res = cli("bake", str(cli_src), "--heads", "1.*", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    res = cli("inspect", str(tmp_path / "out"), "--json")
    info = json.loads(res.stdout)
    assert (info["num_layers"], info["num_heads"], info["head_dim"]) == (3, 4, 8)
    assert info["ablated_heads"] == "1.0,1.1,1.2,1.3"
    assert info["parameters"] == sum(p.numel() for p in family_model("llama").parameters())


@pytest.mark.parametrize("args, needle", [
    (["bake", "{src}", "--heads", "9.0", "--out", "{tmp}/o"], "outside the model"),
    (["bake", "{src}", "--heads", "1.x", "--out", "{tmp}/o"], "malformed head"),
    (["bake", "{tmp}/missing", "--heads", "0.1", "--out", "{tmp}/o"], "not found"),
    (["bake", "{src}", "--heads", "0.1", "--out", "{tmp}/exists"], "already exists"),
    (["inspect", "{tmp}/mamba"], "unsupported architecture MambaForCausalLM"),
    (["inspect", "no-such-org/no-such-model"], "could not be fetched"),
    (["bake", "{src}"], "required"),
])
def test_cli_bad_input_one_line_exit_2(cli_src, tmp_path, args, needle):
    (tmp_path / "exists").mkdir()
    (tmp_path / "mamba").mkdir()  # no attention heads at all: refused before any weight file is looked for
    (tmp_path / "mamba" / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"],
                                                                "num_hidden_layers": 2, "hidden_size": 16}))
    res = cli(*[a.format(src=cli_src, tmp=tmp_path) for a in args])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()


def test_import_headedit_does_not_import_textual():
    code = "import headedit, headedit.cli, headedit.export.bake, sys; assert 'textual' not in sys.modules, 'textual imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_cli_reports_bad_input_without_loading_torch():
    """A mistyped path must answer at once: argument parsing and recipe checks never import torch."""
    code = ("import sys; from headedit.cli import main; rc = main(['discover', '/no/such/recipe.toml']); "
            "assert rc == 2, rc; assert 'torch' not in sys.modules, 'torch imported'; "
            "from headedit import ablate; assert 'torch' in sys.modules")  # the lazy export still works
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "recipe" in res.stderr and "not found" in res.stderr
