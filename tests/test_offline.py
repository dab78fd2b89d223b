"""No network: HF_HUB_OFFLINE is honoured and an unreachable Hub is noticed in seconds (not datasets' ~25 s of
retries), with one line saying how to use local data."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headedit import offline
from headedit.errors import TaskError
from headedit.tasks.data import load_rows

ROOT = Path(__file__).resolve().parent.parent


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: connections are refused


@pytest.fixture
def no_local_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADEDIT_DATA_DIR", raising=False)
    offline._cache.clear()
    yield
    offline._cache.clear()


def test_unreachable_endpoint_fails_fast_with_local_data_hint(monkeypatch, no_local_data) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.monotonic()
    with pytest.raises(TaskError) as err:
        load_rows("google/boolq", "validation", "boolq")
    assert time.monotonic() - started < 3.0
    text = str(err.value)
    assert "cannot reach http://127.0.0.1:" in text and "HEADEDIT_DATA_DIR" in text and "boolq/validation.jsonl" in text
    assert "\n" not in text


def test_black_holed_endpoint_is_given_up_within_the_probe_timeout(monkeypatch, no_local_data) -> None:
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://192.0.2.1:81")  # TEST-NET-1: never answers (or has no route)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.monotonic()
    reason = offline.hub_unreachable(timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert reason is not None and "192.0.2.1" in reason
    started = time.monotonic()
    assert offline.hub_unreachable(timeout=0.5) == reason and time.monotonic() - started < 0.05  # asked once


def test_hf_hub_offline_is_honoured_without_probing(monkeypatch, no_local_data) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://192.0.2.1:81")  # TEST-NET: a probe would hang, not fail
    started = time.monotonic()
    assert offline.hub_unreachable() == "HF_HUB_OFFLINE is set"
    assert time.monotonic() - started < 0.1


def test_cli_offline_hf_hub_offline_and_closed_endpoint_fail_fast(tmp_path: Path) -> None:
    """Through the CLI: `headedit eval` of a hub task without local data, offline both ways, is one line in
    seconds (the model is the bundled one, so only the data needs the Hub)."""
    base = {k: v for k, v in os.environ.items() if k not in ("HEADEDIT_DATA_DIR", "HF_HUB_OFFLINE")}
    cases = {"HF_HUB_OFFLINE": {**base, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
             "closed port": {**base, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}",
                             "HF_HOME": str(tmp_path / "hf")}}
    for name, env in cases.items():
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "headedit", "eval", "headedit:demo", "--task", "boolq",
                               "--limit", "4"], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)
        took = time.monotonic() - started
        assert proc.returncode == 2, (name, proc.stderr)
        err = proc.stderr.strip()
        assert err.count("\n") == 0 and "HEADEDIT_DATA_DIR" in err, (name, err)
        assert ("HF_HUB_OFFLINE is set" if name == "HF_HUB_OFFLINE" else "cannot reach http://127.0.0.1:") in err
        # no retry storm (datasets logs "Retrying in 1s [Retry 1/5]" and sleeps ~25 s); the bound is loose
        # because importing torch alone takes many seconds on a loaded 2-core machine
        assert "Retrying" not in proc.stderr and took < 60.0, (name, took)


def test_plan_offline_notes_how_to_point_at_local_data(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HEADEDIT_DATA_DIR", "HF_HUB_OFFLINE")}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    proc = subprocess.run([sys.executable, "-m", "headedit", "plan", str(ROOT / "recipes" / "smollm3-boolq.toml"),
                           "--model", str(ROOT / "headedit" / "demo" / "model"), "--device-flops", "a100"],
                          cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "cannot reach http://127.0.0.1:" in out and "HEADEDIT_DATA_DIR" in out and "Retrying" not in proc.stderr
