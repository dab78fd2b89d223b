"""Make an ablation permanent: zero the chosen heads' input slices of the attention output projection.

Which tensor and which slice come from the model's `HeadGeometry`: columns of a Linear weight [out, in],
rows of GPT-2's Conv1D weight [in, out]; biases are never changed.

Streams one shard at a time (never two copies of a large model in memory), leaves every other
tensor byte-identical, and writes a manifest whose hashes later let push re-verify the export.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterable, Sequence

from headedit import __version__
from headedit.atomic import atomic_dir, sha256_file
from headedit.errors import ExportError, HeadSpecError, ModelLoadError
from headedit.events import Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.export.gguf_bake import bake_gguf_into, check_gguf_edit
from headedit.model.files import check_regular_files, check_vocab, read_bounded
from headedit.model.heads import Head, HeadLayout, format_heads, parse_heads
from headedit.model.loading import (
    SIDE_FILE_PATTERNS,
    ModelSource,
    check_shapes,
    resolve_model,
    safetensors_header,
    source_config,
    source_weight_files,
    weight_files,
)

MANIFEST = "headedit.json"
MANIFEST_FORMAT = 1
# Files of the source that describe the source itself and must not travel into the export.
_NOT_COPIED = {MANIFEST, "README.md", ".gitattributes", "model.safetensors.index.json", "validation.json"}


def _side_files(path: Path) -> list[Path]:
    found: dict[str, Path] = {}
    for pattern in SIDE_FILE_PATTERNS:
        for file in path.glob(pattern):
            if file.is_file() and file.name not in _NOT_COPIED:
                found[file.name] = file
    return [found[name] for name in sorted(found)]


def source_root(source: ModelSource) -> Path:
    """The folder every file bake reads must lie in: the model folder, or for a Hub download the cache's repo
    folder (its snapshot files are links into ../../blobs)."""
    return source.path.parents[1] if source.hub else source.path


def check_contained(source: ModelSource) -> None:
    """Refuse a source whose weights, index or side files are links to outside its folder: bake copies side files
    verbatim into what push publishes, so `LICENSE.txt -> ~/.cache/huggingface/token` would publish a secret."""
    if source.gguf is not None:
        return
    check_regular_files(source.path, SIDE_FILE_PATTERNS)  # a FIFO would hang the copy or silently drop the file
    root = source_root(source).resolve()
    index = source.path / "model.safetensors.index.json"
    for file in [*weight_files(source.path), *([index] if index.is_file() else []), *_side_files(source.path)]:
        try:
            inside = file.resolve(strict=True).is_relative_to(root)
        except (OSError, RuntimeError):
            inside = False
        if not inside:
            raise ExportError(f"source file {file.name} is a link to outside the model folder, so bake will not "
                              "copy it", "replace the link with a copy of the file you mean to publish, or remove it")


def zero_heads(tensor: Any, layout: HeadLayout, heads: Iterable[int], layer: int | None = None) -> Any:
    """Zero the input slices of `heads` in a copy of one layer's projection weight: columns of a Linear
    [out, heads * width], rows of a Conv1D [heads * width, out]. Without `layer`: a Linear of the common width."""
    edited = tensor.clone()
    lay = layout.layer(layer) if layer is not None else None
    for head in heads:
        cols = layout.columns(head, layer)
        if lay is not None and lay.kind == "conv1d":
            edited[cols, :] = 0
        else:
            edited[:, cols] = 0
    return edited


def weight_shapes(files: Sequence[Path]) -> dict[str, list[int]]:
    """{checkpoint key: shape} over every weight file, from the safetensors headers (no tensor read)."""
    return {key: list(info.get("shape", [])) for file in files
            for key, info in safetensors_header(file).items() if key != "__metadata__"}


def write_baked_weights(
    source: Path, layout: HeadLayout, heads: Sequence[Head], target: Path, reporter: Reporter = null_reporter
) -> dict[str, str]:
    """Write the edited weights into `target`; return {file name: sha256 of the source file}."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = weight_files(source)
    check_shapes(layout, files)
    keys = layout.match_weights(weight_shapes(files))  # {layer: checkpoint key}, shapes checked
    by_key = {keys[layer]: (layer, hs) for layer, hs in layout.by_layer(heads).items()}
    source_hashes: dict[str, str] = {}
    reporter(StageStarted("bake", total=len(files), description=f"zeroing {len(heads)} heads"))
    for i, file in enumerate(files):
        source_hashes[file.name] = sha256_file(file)
        with safe_open(str(file), framework="pt") as reader:
            tensors = {}
            for key in reader.keys():
                tensor = reader.get_tensor(key)
                tensors[key] = zero_heads(tensor, layout, by_key[key][1], by_key[key][0]) if key in by_key else tensor
        # Only the format tag: the source's other metadata is not ours to publish (it may hold anything, a token
        # included), and a one-key header is byte-for-byte reproducible (safetensors orders metadata at random).
        save_file(tensors, str(target / file.name), metadata={"format": "pt"})
        del tensors
        reporter(StageProgress("bake", done=i + 1, total=len(files)))
    index = source / "model.safetensors.index.json"
    if index.is_file():
        shutil.copy2(index, target / index.name)
    reporter(StageFinished("bake", summary=f"{len(files)} weight file(s) written"))
    return source_hashes


def write_manifest(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """(Re)hash every file in `folder` except the manifest itself and write headedit.json."""
    manifest = dict(manifest)
    manifest["files"] = {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def bake_into(source: ModelSource, heads: Sequence[Head] | str, target: Path, reporter: Reporter = null_reporter) -> dict[str, Any]:
    """Write a complete baked checkpoint with its manifest into an existing empty folder."""
    config = source_config(source)
    layout = HeadLayout.from_config(config)
    chosen = parse_heads(heads, layout) if isinstance(heads, str) else tuple(layout.check(Head(*h)) for h in heads)
    if source.gguf is not None:  # safetensors of the dequantized weights + the GGUF edited in its quantized blocks
        previous: tuple[Head, ...] = ()
        source_hashes = bake_gguf_into(source.gguf, layout, chosen, target, reporter)
    else:
        check_contained(source)
        previous = _previous_heads(source.path, layout)
        source_hashes = write_baked_weights(source.path, layout, chosen, target, reporter)
        for file in _side_files(source.path):
            shutil.copy2(file, target / file.name)
    all_heads = tuple(sorted(set(chosen) | set(previous)))
    manifest = {
        "format": MANIFEST_FORMAT,
        "headedit_version": __version__,
        "source": {"id": source.id if source.hub or source.id.startswith("headedit:") else Path(source.id).name,
                   "hub": source.hub, "revision": source.revision, "files": source_hashes,
                   "format": "gguf" if source.gguf is not None else "safetensors"},
        "heads": format_heads(all_heads),
        "heads_added": format_heads(chosen),
        "layout": layout.to_dict(),
    }
    return write_manifest(target, manifest)


def _previous_heads(path: Path, layout: HeadLayout) -> tuple[Head, ...]:
    """Heads already zeroed by an earlier headedit bake of the source (they stay zero)."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return ()
    try:
        text = read_bounded(manifest, 16 * 2**20, f"{MANIFEST} of the source").decode("utf-8")
        return parse_heads(json.loads(text).get("heads", ""), layout)
    except (ValueError, AttributeError, RecursionError):
        return ()


def bake(
    source: str | Path,
    heads: Sequence[Head] | str,
    out: str | Path,
    force: bool = False,
    revision: str | None = None,
    reporter: Reporter = null_reporter,
    gguf_file: str | None = None,
    allow_empty: bool = False,
) -> Path:
    """Bake `heads` of `source` into a new checkpoint folder `out`, atomically (an empty head set, an unedited
    copy, only with `allow_empty`)."""
    src = resolve_model(source, revision, gguf_file=gguf_file)
    out = Path(out)
    # Validate everything that can fail cheaply before creating anything on disk.
    config = source_config(src)
    layout = HeadLayout.from_config(config)
    if isinstance(heads, str):
        chosen = parse_heads(heads, layout)
    else:
        chosen = tuple(layout.check(Head(*h)) for h in heads)
    if not chosen and not allow_empty:
        raise HeadSpecError("no heads to zero: the head set is empty, so the bake would be an unedited copy",
                            'name heads, e.g. --heads "3.1,5.7", or pass --allow-empty to copy the model as it is')
    check_contained(src)
    files = source_weight_files(src)
    check_vocab(config, files)
    check_shapes(layout, files)
    if src.gguf is not None:
        check_gguf_edit(src.gguf, layout, chosen)
    with atomic_dir(out, force=force, protect=(src.path,)) as tmp:
        bake_into(src, heads, tmp, reporter)
    return out


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ExportError(f"{folder} has no {MANIFEST}", "export it with `headedit bake` or `headedit export`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise ExportError(f"{MANIFEST} in {folder} is corrupt", "re-export the model") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ExportError(f"{MANIFEST} in {folder} lacks its file list", "re-export the model")
    if int(manifest.get("format", 0)) > MANIFEST_FORMAT:
        raise ExportError(f"{folder} was written by a newer headedit", "upgrade headedit")
    return manifest


def verify_export(folder: str | Path) -> dict[str, Any]:
    """Check every file listed in the manifest exists with its recorded sha256, and no weight file is unlisted."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise ExportError(f"export file {name} listed in {MANIFEST} is missing", "re-export the model")
        if sha256_file(path) != digest:
            raise ExportError(f"export file {name} no longer matches {MANIFEST} (sha256 differs)", "re-export the model")
    for path in folder.glob("*.safetensors"):
        if path.name not in manifest["files"]:
            raise ExportError(f"weight file {path.name} is not in {MANIFEST}", "remove it or re-export the model")
    return manifest


__all__ = ["bake", "bake_into", "verify_export", "read_manifest", "write_manifest", "zero_heads", "MANIFEST", "ModelLoadError"]
