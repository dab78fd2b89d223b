"""In-memory state of the local test Hub: repos, commits, trees, LFS blobs, tokens, one-time upload tickets."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

LFS_THRESHOLD = 10 * 2**20  # files over 10 MiB travel as LFS, like on the Hub
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".png", ".jpg", ".gguf", ".onnx", ".msgpack", ".h5")
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.png filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Entry:
    """One file in a commit's tree."""

    size: int
    lfs: bool
    oid: str  # sha256 for LFS files, git blob sha1 for regular files
    content: bytes | None = None  # regular files only; LFS content lives in HubState.blobs


@dataclass
class Commit:
    sha: str
    parent: str | None
    summary: str
    date: str
    files: dict[str, Entry]


@dataclass
class Repo:
    namespace: str
    name: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    def resolve(self, rev: str) -> Commit | None:
        sha = self.branches.get(rev, rev)
        return self.commits.get(sha)


@dataclass
class User:
    name: str
    orgs: tuple[str, ...] = ()


@dataclass
class HubState:
    tokens: dict[str, tuple[User, str]] = field(default_factory=dict)  # token -> (user, role)
    repos: dict[str, Repo] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content (LFS store)
    uploads: dict[str, tuple[str, int]] = field(default_factory=dict)  # one-time signature -> (oid, size)
    requests: list[tuple[str, str, int]] = field(default_factory=list)  # (method, path, status), for tests
    lock: threading.RLock = field(default_factory=threading.RLock)


def regular_entry(data: bytes) -> Entry:
    return Entry(size=len(data), lfs=False, oid=git_blob_sha1(data), content=data)


def lfs_pointer(e: Entry) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{e.oid}\nsize {e.size}\n".encode()


_counter = iter(range(10**9))


def make_commit(parent: str | None, summary: str, files: dict[str, Entry]) -> Commit:
    tree = json.dumps(sorted((p, e.oid) for p, e in files.items()))
    sha = hashlib.sha1(f"{parent}\n{summary}\n{tree}\n{next(_counter)}".encode()).hexdigest()
    date = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    return Commit(sha, parent, summary, date, files)


def check_model_index(meta: dict[str, Any]) -> list[dict[str, str]]:
    """The Hub rejects a malformed model-index; check the shape the client's cards must have."""
    index = meta.get("model-index")
    if index is None:
        return []
    errors = []
    if not isinstance(index, list):
        return [{"message": "model-index must be a list"}]
    for model in index:
        if not isinstance(model, dict) or "name" not in model or not isinstance(model.get("results"), list):
            errors.append({"message": "each model-index entry needs a name and a results list"})
            continue
        for result in model["results"]:
            task, dataset, metrics = result.get("task"), result.get("dataset"), result.get("metrics")
            if not (isinstance(task, dict) and "type" in task):
                errors.append({"message": "model-index result needs task.type"})
            if not (isinstance(dataset, dict) and "type" in dataset and "name" in dataset):
                errors.append({"message": "model-index result needs dataset.type and dataset.name"})
            if not (isinstance(metrics, list) and all(isinstance(m, dict) and "type" in m and "value" in m for m in metrics)):
                errors.append({"message": "model-index metrics need type and value"})
    return errors
