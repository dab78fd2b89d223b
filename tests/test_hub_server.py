"""The local Hub server itself: the protocol facts the client relies on (see tests/hub/server.py)."""
from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request


def _call(url: str, method: str = "GET", body: bytes | None = None, token: str | None = None,
          ctype: str = "application/json") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_create_repeat_is_409_with_url_and_errors_carry_codes(hub_server, hub_user):
    base, tok = hub_server.url, hub_user.token
    body = json.dumps({"name": "proto", "organization": None}).encode()
    status, _, data = _call(f"{base}/api/repos/create", "POST", body, tok)
    assert status == 200 and json.loads(data)["url"] == f"{base}/{hub_user.name}/proto"
    status, _, data = _call(f"{base}/api/repos/create", "POST", body, tok)
    assert status == 409 and json.loads(data)["url"] == f"{base}/{hub_user.name}/proto"
    assert _call(f"{base}/api/repos/create", "POST", body, hub_user.read_token)[0] == 403
    assert _call(f"{base}/api/whoami-v2", token="hf_bogus_token_value")[0] == 401
    assert _call(f"{base}/api/agent-harnesses")[0] == 404

    codes = {
        f"{base}/api/models/{hub_user.name}/nothing": "RepoNotFound",
        f"{base}/api/models/{hub_user.name}/proto/revision/nope": "RevisionNotFound",
        f"{base}/{hub_user.name}/proto/resolve/main/missing.json": "EntryNotFound",
    }
    for url, code in codes.items():
        status, headers, _ = _call(url)
        assert status == 404 and headers.get("X-Error-Code") == code, url
    status, headers, data = _call(f"{base}/{hub_user.name}/proto/resolve/main/.gitattributes")
    assert status == 200 and len(headers["X-Repo-Commit"]) == 40 and headers["ETag"].strip('"') and data


def test_lfs_upload_urls_are_signed_and_one_time(hub_server, hub_user):
    base, tok = hub_server.url, hub_user.token
    _call(f"{base}/api/repos/create", "POST", json.dumps({"name": "lfs"}).encode(), tok)
    blob = b"\x00weights" * 100
    oid = hashlib.sha256(blob).hexdigest()
    batch = json.dumps({"operation": "upload", "transfers": ["basic"], "objects": [{"oid": oid, "size": len(blob)}],
                        "hash_algo": "sha256"}).encode()
    assert _call(f"{base}/{hub_user.name}/lfs.git/info/lfs/objects/batch", "POST", batch, hub_user.read_token)[0] == 403
    status, _, data = _call(f"{base}/{hub_user.name}/lfs.git/info/lfs/objects/batch", "POST", batch, tok)
    href = json.loads(data)["objects"][0]["actions"]["upload"]["href"]
    assert "sig=" in href
    assert _call(href.split("?")[0], "PUT", blob, ctype="application/octet-stream")[0] == 403  # unsigned
    assert _call(href, "PUT", blob[:-1] + b"!", ctype="application/octet-stream")[0] == 400  # wrong content
    status, _, data = _call(f"{base}/{hub_user.name}/lfs.git/info/lfs/objects/batch", "POST", batch, tok)
    href = json.loads(data)["objects"][0]["actions"]["upload"]["href"]
    assert _call(href, "PUT", blob, ctype="application/octet-stream")[0] == 200  # no auth header needed
    assert _call(href, "PUT", blob, ctype="application/octet-stream")[0] == 403  # used once already
    status, _, data = _call(f"{base}/{hub_user.name}/lfs.git/info/lfs/objects/batch", "POST", batch, tok)
    assert "actions" not in json.loads(data)["objects"][0]  # already stored: nothing to upload

    commit = b"\n".join(json.dumps(x).encode() for x in [
        {"key": "header", "value": {"summary": "add weights"}},
        {"key": "lfsFile", "value": {"path": "w.safetensors", "algo": "sha256", "oid": oid, "size": len(blob)}}])
    status, _, data = _call(f"{base}/api/models/{hub_user.name}/lfs/commit/main", "POST", commit, tok, "application/x-ndjson")
    assert status == 200 and json.loads(data)["commitUrl"].endswith(json.loads(data)["commitOid"])
    status, headers, data = _call(f"{base}/{hub_user.name}/lfs/resolve/main/w.safetensors")
    assert data == blob and headers["X-Linked-Etag"] == f'"{oid}"'
