"""pytest plugin: a Hub-compatible server on 127.0.0.1 for the whole test session.

List it in the top-level conftest (`pytest_plugins = ["hub.fixtures"]` when tests/ has no __init__.py).
huggingface_hub reads HF_ENDPOINT, HF_HUB_DISABLE_XET and HF_HOME once, when first imported, so this
module sets them at import time (before any test module imports transformers or huggingface_hub);
subprocesses inherit them. Without the `hub_server` fixture nothing listens on the port, so a test that
reaches for the Hub by accident fails fast instead of touching the internet.

Fixtures:
- `hub_server` (session): the running `LocalHubServer`; `.url`, `.add_user(name, orgs=(), role="write")`,
  `.file_bytes(repo_id, path, rev)`, `.state` (repos, requests log).
- `hub_user` (function): a fresh user with a write token and a read-only token.
- `hub_env` (function): an environment dict for subprocesses (`headedit` CLI, `python -c` loaders): points
  at the server, fresh HF_HOME cache, HF_TOKEN = the user's write token.
"""
from __future__ import annotations

import atexit
import itertools
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from .server import LocalHubServer


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


HUB_PORT = _free_port()
HUB_URL = f"http://127.0.0.1:{HUB_PORT}"
HF_HOME = tempfile.mkdtemp(prefix="headedit-test-hf-home-")
atexit.register(shutil.rmtree, HF_HOME, ignore_errors=True)
HUB_ENV = {
    "HF_ENDPOINT": HUB_URL,
    "HF_HUB_DISABLE_XET": "1",
    "HF_HOME": HF_HOME,
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_ETAG_TIMEOUT": "5",
    "HF_HUB_DOWNLOAD_TIMEOUT": "10",
}
# Set before huggingface_hub is imported; a real token from the developer's shell must never reach tests.
os.environ.update(HUB_ENV)
for _var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HUGGINGFACE_CO_STAGING"):
    os.environ.pop(_var, None)
# If something imported huggingface_hub first, in-process clients still point elsewhere; subprocesses are fine.
_IMPORTED_EARLY = "huggingface_hub" in sys.modules and getattr(
    sys.modules.get("huggingface_hub.constants"), "ENDPOINT", HUB_URL
) != HUB_URL

_user_ids = itertools.count(1)


@dataclass(frozen=True)
class HubUser:
    name: str
    token: str  # write role
    read_token: str  # read role


@pytest.fixture(scope="session")
def hub_server() -> Iterator[LocalHubServer]:
    server = LocalHubServer(HUB_PORT).start()
    server.inprocess_ok = not _IMPORTED_EARLY  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub_user(hub_server: LocalHubServer) -> HubUser:
    name = f"user{next(_user_ids)}"
    return HubUser(name, hub_server.add_user(name), hub_server.add_user(name, role="read"))


@pytest.fixture
def hub_env(hub_server: LocalHubServer, hub_user: HubUser, tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HUB_ENV)
    env["HF_HOME"] = str(tmp_path / "hf_home")  # a fresh cache: every download really goes over HTTP
    env["HF_TOKEN"] = hub_user.token
    return env


@pytest.fixture
def hub_inprocess(hub_server: LocalHubServer) -> LocalHubServer:
    """For tests that call huggingface_hub in the pytest process itself."""
    if not getattr(hub_server, "inprocess_ok", False):
        pytest.fail("huggingface_hub was imported before the hub.fixtures plugin set HF_ENDPOINT; "
                    "list hub.fixtures first in pytest_plugins")
    return hub_server


@pytest.fixture(scope="session")
def hub_export_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(source, run, export) built once per session: a baked tiny Llama with card; copy it before changing it."""
    from .builders import make_export

    return make_export(tmp_path_factory.mktemp("hub-export"))


@pytest.fixture
def hub_export(hub_export_template: tuple[Path, Path, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """A private copy of (source, run, export) for one test."""
    source, run, export = hub_export_template
    return source, _copy(run, tmp_path / "run"), _copy(export, tmp_path / "export")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
