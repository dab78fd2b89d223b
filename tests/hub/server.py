"""A small Hugging Face Hub-compatible HTTP server for tests, run in-process on 127.0.0.1.

It speaks the subset of the Hub API that huggingface_hub 2.x and transformers 5.x use to create repos,
commit files (regular + LFS "basic" transfer, no Xet), create branches and download files, with
real auth semantics: tokens with read/write roles, private repos visible only to their owner,
X-Error-Code headers that the client maps to RepositoryNotFound/RevisionNotFound/EntryNotFound.
State lives in memory; blobs are small in tests.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .store import (
    GITATTRIBUTES,
    LFS_SUFFIXES,
    LFS_THRESHOLD,
    Commit,
    Entry,
    HubState,
    Repo,
    User,
    check_model_index,
    git_blob_sha1,
    lfs_pointer,
    make_commit,
    regular_entry,
)


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.body = status, message, code, body


_NAME = r"[A-Za-z0-9][\w.\-]*"
_REPO = rf"(?P<ns>{_NAME})/(?P<name>{_NAME})"
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p), h)
    for m, p, h in [
        ("GET", r"^/api/whoami-v2$", "whoami"),
        ("POST", r"^/api/repos/create$", "create_repo"),
        ("POST", r"^/api/validate-yaml$", "validate_yaml"),
        ("POST", rf"^/api/models/{_REPO}/preupload/(?P<rev>[^/]+)$", "preupload"),
        ("POST", rf"^/api/models/{_REPO}/commit/(?P<rev>[^/]+)$", "commit"),
        ("POST", rf"^/api/models/{_REPO}/branch/(?P<rev>[^/]+)$", "create_branch"),
        ("GET", rf"^/api/models/{_REPO}/refs$", "refs"),
        ("GET", rf"^/api/models/{_REPO}/commits/(?P<rev>[^/]+)$", "commits"),
        ("POST", rf"^/api/models/{_REPO}/paths-info/(?P<rev>[^/]+)$", "paths_info"),
        ("GET", rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$", "tree"),
        ("GET", rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$", "model_info"),
        ("POST", rf"^/{_REPO}\.git/info/lfs/objects/batch$", "lfs_batch"),
        ("POST", rf"^/{_REPO}\.git/info/lfs/objects/verify$", "lfs_verify"),
        ("PUT", r"^/_lfs/upload/(?P<oid>[0-9a-f]{64})$", "lfs_put"),
        ("GET", rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$", "resolve"),
        ("HEAD", rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$", "resolve"),
    ]
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects
    server: "LocalHubServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr
        return None

    # ---- plumbing -----------------------------------------------------------------------
    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        self.query = parse_qs(url.query)
        # Always read the whole body first: answering early desynchronises keep-alive connections.
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        status = 404
        try:
            for method, pattern, handler in ROUTES:
                match = pattern.match(path)
                if match and method == self.command:
                    groups = {k: unquote(v) if v is not None else None for k, v in match.groupdict().items()}
                    fault = self.server.faults.get(handler)
                    if fault is not None:
                        status = self._fault(fault)
                        break
                    status = getattr(self, "h_" + handler)(**groups)
                    break
            else:
                raise HubError(404, f"no route {self.command} {path}")
        except HubError as err:
            status = err.status
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            self._json(err.status, err.body if err.body is not None else {"error": err.message}, headers)
        except Exception as err:  # a bug in the test server must surface as a 500, not a hang
            status = 500
            self._json(500, {"error": f"{type(err).__name__}: {err}"})
        with self.server.state.lock:
            self.server.state.requests.append((self.command, unquote(path), status))

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _dispatch

    def _fault(self, fault: str) -> int:
        """A hostile or broken server, for one route: `hang` (accept, never answer), `html` / `json-array` (status
        200 with a body that is not the Hub API), `die` (the server stops listening and drops this request, as if
        killed mid-upload)."""
        if fault == "hang":
            self.server.release.wait(120)
            self.close_connection = True
            return 0
        if fault == "html":
            return self._send(200, b"<!doctype html><html><body>Welcome to nginx!</body></html>", ctype="text/html")
        if fault == "json-array":
            return self._json(200, [1, 2, 3])
        if fault == "die":
            self.server.die()
            self.close_connection = True
            return 0
        raise AssertionError(f"unknown fault {fault!r}")

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, ctype: str = "application/json") -> int:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return status

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> int:
        return self._send(status, json.dumps(obj).encode(), headers)

    def _body_json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError:
            raise HubError(400, "body is not JSON") from None

    @property
    def base(self) -> str:
        return self.server.url

    # ---- auth -------------------------------------------------------------------------
    def _auth(self, required: bool = False) -> tuple[User | None, str | None]:
        header = self.headers.get("Authorization", "")
        if not header:
            if required:
                raise HubError(401, "Invalid username or password.")
            return None, None
        token = header.removeprefix("Bearer ").strip()
        found = self.server.state.tokens.get(token)
        if found is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return found

    def _repo(self, ns: str, name: str, write: bool = False) -> tuple[Repo, User | None]:
        user, role = self._auth(required=write)
        repo = self.server.state.repos.get(f"{ns}/{name}")
        owns = user is not None and (ns == user.name or ns in user.orgs)
        if repo is None or (repo.private and not owns):
            raise HubError(404, "Repository not found", "RepoNotFound")
        if write:
            if role != "write":
                raise HubError(403, "Forbidden: you must use a write token to upload to a repository")
            if not owns:
                raise HubError(403, f"Forbidden: you don't have the rights to write to {repo.id}")
        return repo, user

    @staticmethod
    def _commit(repo: Repo, rev: str) -> Commit:
        commit = repo.resolve(unquote(rev))
        if commit is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    # ---- routes -------------------------------------------------------------------------
    def h_whoami(self) -> int:
        user, role = self._auth(required=True)
        assert user is not None
        return self._json(200, {
            "type": "user", "id": hashlib.sha1(user.name.encode()).hexdigest()[:24], "name": user.name,
            "fullname": user.name, "orgs": [{"name": o, "type": "org", "roleInOrg": "admin"} for o in user.orgs],
            "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": role}},
        })

    def h_create_repo(self) -> int:
        user, role = self._auth(required=True)
        assert user is not None
        body = self._body_json()
        if body.get("type", "model") != "model":
            raise HubError(400, "only model repos are served here")
        name = str(body.get("name", ""))
        ns = body.get("organization") or user.name
        if not re.fullmatch(_NAME, name) or not re.fullmatch(_NAME, ns):
            raise HubError(400, f"invalid repo name {ns}/{name}")
        if role != "write" or (ns != user.name and ns not in user.orgs):
            raise HubError(403, f"You don't have the rights to create a model under the namespace \"{ns}\"")
        repo_id = f"{ns}/{name}"
        url = f"{self.base}/{repo_id}"
        with self.server.state.lock:
            if repo_id in self.server.state.repos:
                raise HubError(409, "You already created this model repo", body={"error": "You already created this model repo", "url": url})
            private = body.get("visibility") == "private" or bool(body.get("private"))
            repo = Repo(ns, name, private)
            first = make_commit(None, "initial commit", {".gitattributes": regular_entry(GITATTRIBUTES)})
            repo.commits[first.sha] = first
            repo.branches["main"] = first.sha
            self.server.state.repos[repo_id] = repo
        return self._json(200, {"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def h_validate_yaml(self) -> int:
        import yaml

        content = str(self._body_json().get("content", ""))
        errors: list[dict[str, str]] = []
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.S)
        if match is None:
            return self._json(200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata"}]})
        try:
            meta = yaml.safe_load(match.group(1))
        except yaml.YAMLError as err:
            meta, errors = None, [{"message": f"invalid YAML: {err}"}]
        if not errors and not isinstance(meta, dict):
            errors.append({"message": "metadata must be a YAML mapping"})
        if not errors:
            errors = check_model_index(meta)
        if errors:
            return self._json(400, {"errors": errors, "warnings": []})
        return self._json(200, {"errors": [], "warnings": []})

    def h_preupload(self, ns: str, name: str, rev: str) -> int:
        repo, _ = self._repo(ns, name, write=True)
        commit = repo.resolve(unquote(rev))
        files = []
        for item in self._body_json().get("files", []):
            path, size = item["path"], int(item["size"])
            sample = base64.b64decode(item.get("sample", ""))
            lfs = size > LFS_THRESHOLD or path.endswith(LFS_SUFFIXES) or b"\0" in sample
            old = commit.files.get(path) if commit else None
            files.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          "oid": old.oid if old else None})
        return self._json(200, {"files": files, "commitOid": commit.sha if commit else None})

    def h_lfs_batch(self, ns: str, name: str) -> int:
        self._repo(ns, name, write=True)
        body = self._body_json()
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            raise HubError(400, "only basic LFS uploads are served here")
        objects = []
        state = self.server.state
        for obj in body.get("objects", []):
            oid, size = str(obj["oid"]), int(obj["size"])
            if oid in state.blobs:
                objects.append({"oid": oid, "size": size})  # already stored: no actions
                continue
            sig = secrets.token_urlsafe(24)
            with state.lock:
                state.uploads[sig] = (oid, size)
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                # The PUT carries no auth header, so the URL itself is the (one-time) credential.
                "upload": {"href": f"{self.base}/_lfs/upload/{oid}?sig={sig}"},
                "verify": {"href": f"{self.base}/{ns}/{name}.git/info/lfs/objects/verify"},
            }})
        return self._json(200, {"transfer": "basic", "objects": objects}, {"Content-Type": "application/vnd.git-lfs+json"})

    def h_lfs_put(self, oid: str) -> int:
        sig = (self.query.get("sig") or [""])[0]
        state = self.server.state
        with state.lock:
            ticket = state.uploads.pop(sig, None)
        if ticket is None or ticket[0] != oid:
            raise HubError(403, "upload URL is invalid or was already used")
        if len(self.body) != ticket[1] or hashlib.sha256(self.body).hexdigest() != oid:
            raise HubError(400, "uploaded content does not match its oid and size")
        with state.lock:
            state.blobs[oid] = self.body
        return self._send(200, b"", ctype="text/plain")

    def h_lfs_verify(self, ns: str, name: str) -> int:
        self._repo(ns, name, write=True)
        body = self._body_json()
        blob = self.server.state.blobs.get(str(body.get("oid")))
        if blob is None or len(blob) != int(body.get("size", -1)):
            raise HubError(404, "object not found", "EntryNotFound")
        return self._json(200, {"success": True})

    def h_commit(self, ns: str, name: str, rev: str) -> int:
        repo, _ = self._repo(ns, name, write=True)
        state = self.server.state
        lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        with state.lock:
            parent = self._commit(repo, rev)
            branch = unquote(rev)
            if branch not in repo.branches:
                raise HubError(400, f"cannot commit to {branch}: not a branch")
            if header.get("parentCommit") and header["parentCommit"] != parent.sha:
                raise HubError(412, "A commit has happened since the parent commit")
            files = dict(parent.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if not path or path.startswith("/") or ".." in path.split("/"):
                    raise HubError(400, f"invalid path {path!r}")
                if key == "file":
                    if value.get("encoding") != "base64":
                        raise HubError(400, "only base64 file content is served here")
                    files[path] = regular_entry(base64.b64decode(value["content"]))
                elif key == "lfsFile":
                    blob = state.blobs.get(value["oid"])
                    if blob is None:
                        raise HubError(422, f"LFS object {value['oid']} for {path} was never uploaded")
                    files[path] = Entry(size=len(blob), lfs=True, oid=value["oid"])
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                elif key == "deletedFolder":
                    files = {p: e for p, e in files.items() if not p.startswith(path.rstrip("/") + "/")}
                else:
                    raise HubError(400, f"unknown commit operation {key!r}")
            commit = make_commit(parent.sha, str(header.get("summary", "")), files)
            repo.commits[commit.sha] = commit
            repo.branches[branch] = commit.sha
        return self._json(200, {"success": True, "commitOid": commit.sha,
                                "commitUrl": f"{self.base}/{repo.id}/commit/{commit.sha}", "pullRequestUrl": None})

    def h_create_branch(self, ns: str, name: str, rev: str) -> int:
        repo, _ = self._repo(ns, name, write=True)
        branch = unquote(rev)
        start = self._body_json().get("startingPoint") or "main"
        with self.server.state.lock:
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            repo.branches[branch] = self._commit(repo, start).sha
        return self._json(200, {"success": True})

    def h_refs(self, ns: str, name: str) -> int:
        repo, _ = self._repo(ns, name)
        branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": sha} for b, sha in sorted(repo.branches.items())]
        return self._json(200, {"branches": branches, "converts": [], "tags": [], "pullRequests": []})

    def h_commits(self, ns: str, name: str, rev: str) -> int:
        repo, _ = self._repo(ns, name)
        commit: Commit | None = self._commit(repo, rev)
        out = []
        while commit is not None:
            out.append({"id": commit.sha, "title": commit.summary, "message": "", "date": commit.date,
                        "authors": [{"user": repo.namespace}]})
            commit = repo.commits.get(commit.parent) if commit.parent else None
        return self._json(200, out)

    def h_model_info(self, ns: str, name: str, rev: str | None = None) -> int:
        repo, _ = self._repo(ns, name)
        commit = self._commit(repo, rev or "main")
        siblings = [{"rfilename": p, "size": e.size, "blobId": e.oid if not e.lfs else git_blob_sha1(lfs_pointer(e)),
                     **({"lfs": {"size": e.size, "sha256": e.oid, "pointerSize": len(lfs_pointer(e))}} if e.lfs else {})}
                    for p, e in sorted(commit.files.items())]
        return self._json(200, {"id": repo.id, "modelId": repo.id, "author": repo.namespace, "sha": commit.sha,
                                "private": repo.private, "disabled": False, "gated": False, "tags": [],
                                "lastModified": commit.date, "createdAt": commit.date, "siblings": siblings})

    def _file_info(self, path: str, e: Entry, expand: bool, commit: Commit) -> dict[str, Any]:
        info: dict[str, Any] = {"type": "file", "path": path, "size": e.size,
                                "oid": e.oid if not e.lfs else git_blob_sha1(lfs_pointer(e))}
        if e.lfs:
            info["lfs"] = {"oid": e.oid, "size": e.size, "pointerSize": len(lfs_pointer(e))}
        if expand:
            info["lastCommit"] = {"id": commit.sha, "title": commit.summary, "date": commit.date}
        return info

    def h_paths_info(self, ns: str, name: str, rev: str) -> int:
        repo, _ = self._repo(ns, name)
        commit = self._commit(repo, rev)
        form = parse_qs(self.body.decode())
        expand = (form.get("expand") or ["False"])[0].lower() == "true"
        out = []
        for path in form.get("paths", []):
            if path in commit.files:
                out.append(self._file_info(path, commit.files[path], expand, commit))
            elif any(p.startswith(path.rstrip("/") + "/") for p in commit.files):
                out.append({"type": "directory", "path": path.rstrip("/"), "oid": "0" * 40})
        return self._json(200, out)

    def h_tree(self, ns: str, name: str, rev: str, path: str | None = None) -> int:
        repo, _ = self._repo(ns, name)
        commit = self._commit(repo, rev)
        prefix = (path or "").strip("/")
        prefix = prefix + "/" if prefix else ""
        recursive = (self.query.get("recursive") or ["false"])[0].lower() in ("true", "1")
        expand = (self.query.get("expand") or ["false"])[0].lower() in ("true", "1")
        out, folders = [], set()
        for p, e in sorted(commit.files.items()):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/", 1)[0])
                continue
            out.append(self._file_info(p, e, expand, commit))
        if prefix and not out and not folders:
            raise HubError(404, f"{path} does not exist on {rev}", "EntryNotFound")
        out += [{"type": "directory", "path": f, "oid": "0" * 40} for f in sorted(folders)]
        return self._json(200, out)

    def h_resolve(self, ns: str, name: str, rev: str, path: str) -> int:
        repo, _ = self._repo(ns, name)
        commit = self._commit(repo, rev)
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        data = self.server.state.blobs[entry.oid] if entry.lfs else (entry.content or b"")
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{entry.oid}"', "Accept-Ranges": "bytes"}
        if entry.lfs:
            headers.update({"X-Linked-Etag": f'"{entry.oid}"', "X-Linked-Size": str(entry.size)})
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if rng and self.command == "GET":
            start = int(rng.group(1))
            end = int(rng.group(2)) + 1 if rng.group(2) else len(data)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
            return self._send(206, data[start:end], headers, "application/octet-stream")
        return self._send(200, data, headers, "application/octet-stream")


class LocalHubServer(ThreadingHTTPServer):
    """The server plus its state; `add_user` hands out tokens."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.state = HubState()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread: threading.Thread | None = None
        self.faults: dict[str, str] = {}  # route handler name (e.g. "whoami", "lfs_put") -> fault, see Handler._fault
        self.release = threading.Event()  # lets `hang` handlers go when the server stops
        self.dead = False

    def die(self) -> None:
        """Stop listening at once (new connections are refused), as a server killed mid-request."""
        self.dead = True
        self.shutdown()  # from a handler thread: waits for serve_forever's loop to end (its client is waiting on us)
        self.socket.close()

    def add_user(self, name: str, orgs: tuple[str, ...] = (), role: str = "write") -> str:
        """Register a user (if new) and return a fresh token with `role` ("read" or "write")."""
        token = "hf_" + secrets.token_urlsafe(24)
        with self.state.lock:
            existing = next((u for u, _ in self.state.tokens.values() if u.name == name), None)
            self.state.tokens[token] = (existing or User(name, tuple(orgs)), role)
        return token

    def start(self) -> "LocalHubServer":
        self._thread = threading.Thread(target=self.serve_forever, name="local-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        if not self.dead:
            self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def file_bytes(self, repo_id: str, path: str, rev: str = "main") -> bytes:
        """Read a committed file straight from the server's state (for assertions)."""
        repo = self.state.repos[repo_id]
        commit = repo.resolve(rev)
        assert commit is not None
        entry = commit.files[path]
        return self.state.blobs[entry.oid] if entry.lfs else (entry.content or b"")

    def unhandled(self) -> list[tuple[str, str, int]]:
        """Requests that matched no route (other than the optional agent-harnesses probe)."""
        routes = [p for _, p, _ in ROUTES]
        return [r for r in self.state.requests
                if not any(p.match(r[1]) for p in routes) and r[1] != "/api/agent-harnesses"]
