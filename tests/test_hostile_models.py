"""Model folders headedit did not make: each bad one gets a clear error before weights are allocated."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from testkit.files import tree_digest
from testkit.models import family_model, save_model

from headedit.errors import ExportError, ModelLoadError, UnsupportedModelError
from headedit.export.bake import bake
from headedit.model.loading import load_model


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return save_model(family_model("llama"), tmp_path_factory.mktemp("hostile") / "good")


def variant(good: Path, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(good, folder)
    return folder


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_remote_code_config_refused(good, tmp_path):
    folder = variant(good, tmp_path, "remote")
    edit_config(folder, auto_map={"AutoModelForCausalLM": "evil.EvilModel"})
    (folder / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(ModelLoadError, match="remote code"):
        load_model(folder)


def test_absurd_head_count_refused_before_allocation(good, tmp_path):
    folder = variant(good, tmp_path, "absurd")
    edit_config(folder, num_attention_heads=10**9, num_key_value_heads=10**9)
    with pytest.raises(UnsupportedModelError, match="outside 1..1024"):
        load_model(folder)


def test_mismatched_shapes_refused(good, tmp_path):
    folder = variant(good, tmp_path, "mismatch")
    edit_config(folder, head_dim=4)  # weights were written for head_dim 8
    with pytest.raises(ModelLoadError, match="o_proj.weight has shape"):
        load_model(folder)


def test_truncated_safetensors_refused(good, tmp_path):
    folder = variant(good, tmp_path, "truncated")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(folder)
    with pytest.raises(ModelLoadError, match="not a valid safetensors"):
        bake(folder, "0.1", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_garbage_safetensors_refused(good, tmp_path):
    folder = variant(good, tmp_path, "garbage")
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="not a valid safetensors"):
        load_model(folder)


def test_pickle_only_weights_refused(good, tmp_path):
    folder = variant(good, tmp_path, "pickle")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(ModelLoadError, match="pickle weights"):
        load_model(folder)


def test_missing_config_and_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path / "empty")


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return res.returncode == 0


def test_full_disk_leaves_no_partial_export(good, tmp_path):
    """A real small tmpfs when this machine lets us mount one (CI runs as root)."""
    disk = tmp_path / "small"
    if not _mount_tmpfs(disk, "48k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        before = tree_digest(good)
        with pytest.raises(ExportError, match="disk full"):
            bake(good, "0.1", disk / "out")
        assert list(disk.iterdir()) == []  # neither the export nor its temporary folder
        assert tree_digest(good) == before
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_full_disk_patched_write(good, tmp_path, monkeypatch):
    """Same guarantee where mounting is not allowed: the weight writer fails half-way with ENOSPC."""
    import errno

    import safetensors.torch

    real = safetensors.torch.save_file

    def failing(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", failing)
    with pytest.raises(ExportError, match="disk full"):
        bake(good, "0.1", tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == []
