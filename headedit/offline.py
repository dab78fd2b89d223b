"""Is the Hugging Face Hub reachable? Asked once, answered within PROBE_TIMEOUT seconds.

Without a network, `datasets` retries each request five times with back-off (about 25 s per dataset) before
failing; headedit asks first and, when the Hub cannot be reached, fails (or falls back) at once with a line
saying how to use local data. HF_HUB_OFFLINE is honoured without probing. No huggingface_hub import here.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from urllib.parse import urlsplit

PROBE_TIMEOUT = 2.0  # seconds for DNS + TCP connect to the endpoint (or its proxy)
CACHE_SECONDS = 60.0  # a long-lived process (the TUI) asks again after this long
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "ON", "YES", "TRUE"}
_cache: dict[str, tuple[float, str | None]] = {}
_lock = threading.Lock()


def offline_env() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE) asks for no network at all."""
    return any(os.environ.get(v, "").strip().upper() in _TRUE
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _target(url: str) -> tuple[str, int]:
    """(host, port) a connection to `url` goes to first: its proxy when one is set."""
    parts = urlsplit(url)
    proxy_vars = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy") if parts.scheme == "https" else (
        "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    no_proxy = os.environ.get("NO_PROXY", os.environ.get("no_proxy", ""))
    host = parts.hostname or ""
    bypass = any(host == h.strip() or host.endswith("." + h.strip().lstrip(".")) for h in no_proxy.split(",") if h.strip())
    for var in proxy_vars:
        proxy = os.environ.get(var)
        if proxy and not bypass:
            p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            return p.hostname or "", p.port or 80
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def _probe(url: str, timeout: float) -> str | None:
    """None when a TCP connection to the endpoint (or proxy) opens within `timeout`, else why not."""
    host, port = _target(url)
    if not host:
        return f"HF_ENDPOINT {url!r} has no host"
    outcome: list[str | None] = []

    def connect() -> None:  # in a thread: getaddrinfo has no timeout of its own
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(None)
        except OSError as err:
            outcome.append(err.strerror or type(err).__name__)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout + 0.2)
    if not outcome:
        return f"no answer from {host}:{port} within {timeout:g} s"
    return outcome[0]


def hub_unreachable(timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why the Hub cannot be used now (HF_HUB_OFFLINE set, no route, refused, timed out), or None when it can."""
    if offline_env():
        return "HF_HUB_OFFLINE is set"
    url = endpoint()
    with _lock:
        cached = _cache.get(url)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
    reason = _probe(url, timeout)
    result = None if reason is None else f"cannot reach {url} ({reason})"
    with _lock:
        _cache[url] = (time.monotonic(), result)
    return result


__all__ = ["hub_unreachable", "offline_env", "endpoint", "PROBE_TIMEOUT"]
