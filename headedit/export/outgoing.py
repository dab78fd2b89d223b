"""What push sends: exactly the files the manifest lists, each hash-verified and free of secrets, with a
validation that is bound to this very checkpoint.

Why a module of its own: "what is pushed is what was validated" has three parts that must all hold at the moment
of upload. (1) Only manifest-listed files go up, each read once through an open file whose sha256 is checked on
that same read (a file swapped after the check is not the one uploaded). (2) Every byte of every file, weight
headers and tensor data included, is scanned for the token and for anything shaped like a Hugging Face token.
(3) validation.json names the heads, the source weights and the baked weights it measured; they must equal the
export's, so a validation copied from another run never vouches for this one.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO

from headedit.errors import ExportError

MANIFEST = "headedit.json"
VALIDATION = "validation.json"
MAX_VALIDATION_BYTES = 16 * 2**20
CHUNK = 8 * 2**20
# Any Hugging Face user access token, not only the pushing account's: "hf_" and 34 letters.
_ANY_TOKEN = re.compile(rb"(?<![A-Za-z0-9])hf_[A-Za-z]{34}(?![A-Za-z0-9])")  # used with .match at each "hf_"


def is_weight_file(name: str) -> bool:
    """Files that hold (or index) the weights: what `checkpoint_record` binds a validation to."""
    return name.endswith((".safetensors", ".gguf", ".safetensors.index.json"))


def checkpoint_record(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a validation measured, from the manifest of the checkpoint it reloaded: all zeroed heads, the
    source's weight hashes and the baked weight hashes (bake is byte-for-byte reproducible)."""
    files = manifest.get("files") or {}
    return {
        "heads": str(manifest.get("heads", "")),
        "source_files": dict(sorted(((manifest.get("source") or {}).get("files") or {}).items())),
        "weight_files": {name: files[name] for name in sorted(files) if is_weight_file(name)},
    }


def read_validation(folder: Path) -> dict[str, Any] | None:
    """validation.json of a run or export folder (None when absent), bounded and checked to be an object."""
    path = folder / VALIDATION
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ExportError(f"cannot read {VALIDATION} in {folder.name} ({err.strerror})", "re-export the run") from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_VALIDATION_BYTES:
        raise ExportError(f"{VALIDATION} in {folder.name} is not a regular file of sensible size", "re-export the run")
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError):
        raise ExportError(f"{VALIDATION} in {folder.name} is corrupt", "re-validate the run and re-export it") from None
    if not isinstance(record, dict) or not isinstance(record.get("passed"), bool):
        raise ExportError(f"{VALIDATION} in {folder.name} is not a validation record (no passed: true/false)",
                          "re-validate the run and re-export it")
    return record


def validation_passed(folder: Path, force: bool, manifest: dict[str, Any] | None = None) -> None:
    """Refuse (unless `force`) a folder whose validation is missing or failed. With the export's `manifest`, the
    validation must also be listed in it and be bound to this checkpoint; a validation of another checkpoint is
    refused even with `force` (the card would publish numbers this model never earned)."""
    folder = Path(folder)
    listed = manifest is None or VALIDATION in (manifest.get("files") or {})
    record = read_validation(folder) if listed else None
    if record is None:
        if force:
            return
        unlisted = not listed and (folder / VALIDATION).exists()
        what = "has a validation.json its headedit.json does not list" if unlisted else "has no validation.json"
        raise ExportError(f"{folder.name} {what}, so its gain was never checked on held-out data",
                          "export it from a validated run (`headedit export RUN`) or pass --force")
    if manifest is not None:
        _check_binding(record, manifest, force)
    if record["passed"] is not True and not force:
        raise ExportError("validation did not pass for this export (validation.json says passed: false)",
                          "push anyway with --force, or pick a different head set")


def _check_binding(record: dict[str, Any], manifest: dict[str, Any], force: bool) -> None:
    want_heads = str(manifest.get("heads_added", manifest.get("heads", "")))
    if str(record.get("heads", "")) != want_heads:
        raise ExportError(f"validation.json is for heads {record.get('heads')!r} but this export ablates "
                          f"{want_heads!r}", "export the run that validated these heads, or validate this head set")
    bound = record.get("checkpoint")
    if bound is None:
        if force:
            return
        raise ExportError("validation.json does not name the checkpoint it validated (written by an older headedit)",
                          "re-validate the run (`headedit validate RUN`) and re-export it, or pass --force")
    if not isinstance(bound, dict):
        raise ExportError("validation.json has a corrupt checkpoint record", "re-validate the run and re-export it")
    mine = checkpoint_record(manifest)
    for key, what in (("heads", "heads"), ("source_files", "source model"), ("weight_files", "baked weights")):
        if bound.get(key) != mine[key]:
            raise ExportError(f"validation.json was measured on other {what} than this export's",
                              "re-validate the run and re-export it; a validation only vouches for its own checkpoint")


def upload_paths(export: Path, manifest: dict[str, Any]) -> list[str]:
    """What goes up: the files the manifest hashes and the manifest itself, nothing else."""
    return sorted(set(manifest.get("files") or {}) | {MANIFEST})


def secret_needles(token: str) -> list[bytes]:
    """The token as it could appear in a file: raw, reversed, UTF-16, hex, base64 at each alignment."""
    raw = token.encode()
    found = {raw, raw[::-1], token.encode("utf-16-le"), token.encode("utf-16-be"), raw.hex().encode(),
             raw.hex().upper().encode()}
    for shift in range(3):  # base64 of a longer text that contains the token starts at one of 3 alignments
        encoded = base64.b64encode(b"\0" * shift + raw)[4 if shift else 0:]
        found.add(encoded[: len(encoded) - 4])  # the last group depends on what follows
    return sorted((n for n in found if len(n) >= 8), key=len)


def _plain_inside(export: Path, name: str) -> Path:
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ExportError(f"{MANIFEST} lists {name[:80]!r}, which is not a file inside the export", "re-export the model")
    path = export / name
    try:
        if not path.resolve(strict=True).is_relative_to(export.resolve()):
            raise ExportError(f"export file {name} is a link to outside the export, so push will not read it",
                              "replace the link with the file itself, or re-export the model")
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, RuntimeError):
        raise ExportError(f"export file {name} listed in {MANIFEST} is missing", "re-export the model") from None
    if not regular:
        raise ExportError(f"export file {name} is not a regular file", "re-export the model")
    return path


def _token_shaped(data: bytes) -> bool:
    """Does `data` hold text shaped like a Hugging Face token? (memchr-speed search for "hf_", regex only there)"""
    at = data.find(b"hf_")
    while at >= 0:
        if _ANY_TOKEN.match(data, at):  # the lookbehind still sees the byte before `at`
            return True
        at = data.find(b"hf_", at + 1)
    return False


def _scan(name: str, fh: BinaryIO, needles: list[bytes]) -> str:
    """sha256 of the open file, refusing it if any needle or token-shaped text occurs anywhere in its bytes."""
    digest = hashlib.sha256()
    keep = max([len(n) for n in needles] + [40]) - 1
    tail = b""
    while block := fh.read(CHUNK):
        digest.update(block)
        window = tail + block
        if any(n in window for n in needles) or _token_shaped(window):
            raise ExportError(f"refusing to push: {name} in the export contains a Hugging Face token",
                              "remove the token from that file (and from wherever it came from), then re-export")
        tail = window[-keep:]
    return digest.hexdigest()


def open_verified(export: Path, manifest: dict[str, Any], token: str | None) -> dict[str, BinaryIO]:
    """{name: open file, rewound} for every upload path: read once each, sha256 checked against the manifest on
    that read and scanned for secrets; the caller uploads from these very files and closes them."""
    needles = secret_needles(token) if token else []
    files: dict[str, str] = manifest.get("files") or {}
    opened: dict[str, BinaryIO] = {}
    try:
        for name in upload_paths(export, manifest):
            fh: BinaryIO = open(_plain_inside(export, name), "rb")  # noqa: SIM115 - the caller uploads and closes it
            opened[name] = fh
            digest = _scan(name, fh, needles)
            if name != MANIFEST and digest != files[name]:
                raise ExportError(f"export file {name} no longer matches {MANIFEST} (sha256 differs)", "re-export the model")
            fh.seek(0)
    except BaseException:
        for handle in opened.values():
            handle.close()
        raise
    return opened


__all__ = ["checkpoint_record", "is_weight_file", "open_verified", "read_validation", "secret_needles",
           "upload_paths", "validation_passed"]
