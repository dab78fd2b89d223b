"""Fingerprints of folders, for "nothing changed" and "same bytes as the reference" checks."""
from __future__ import annotations

import hashlib
from pathlib import Path


def tree_digest(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file below `folder`."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}
