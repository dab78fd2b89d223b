"""Publish an export folder to the Hugging Face Hub, and read a manifest back from it.

Why a module of its own: every Hub failure (bad token, read-only token, someone else's namespace,
missing repo, unreachable endpoint, a server that never answers or answers something that is not the Hub
API) must become one `HubError` line with a hint, and the token must never leave memory. What is uploaded
is decided and checked by `headedit.export.outgoing` before a byte is sent.
"""
from __future__ import annotations

import io
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from headedit.errors import ExportError, HubError
from headedit.events import (
    Log,
    Reporter,
    StageFinished,
    StageProgress,
    StageStarted,
    null_reporter,
)
from headedit.export.outgoing import open_verified, upload_paths, validation_passed

MANIFEST = "headedit.json"
# Files `card`/`export` add to an export; they are uploaded only when the manifest lists (hashes) them.
EXPORT_EXTRAS = ("README.md", "heads.png", "recipe.toml", "validation.json")
TIMEOUT_ENV = "HEADEDIT_HUB_TIMEOUT"
DEFAULT_TIMEOUT = 60.0  # seconds a Hub request may wait for the next byte; uploads of any size keep flowing
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")
_LOGIN_HINT = "set HF_TOKEN to a valid token or run `hf auth login`"


def check_repo_id(repo_id: str) -> str:
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".git", ".")):
        raise HubError(f"invalid repo id {repo_id!r}", "use NAMESPACE/NAME, e.g. your-user/llama-edited")
    return repo_id


def hub_token(token: str | None) -> str:
    """The token to use (given, then HF_TOKEN, then the login cache); one that cannot be sent in an HTTP
    header (non-ASCII, spaces, control characters) is refused here without echoing it."""
    found = token
    if not found:
        from huggingface_hub import get_token

        found = get_token()  # HF_TOKEN, then the login cache; never written anywhere by us
    if not found:
        raise HubError("no Hugging Face token found", _LOGIN_HINT)
    if not (found.isascii() and found.isprintable()) or any(c.isspace() for c in found) or len(found) > 1024:
        raise HubError("the Hugging Face token has characters no token has (non-ASCII, spaces or control "
                       "characters)", _LOGIN_HINT)
    return found


def hub_timeout() -> float:
    """Seconds a Hub request may wait for the server (HEADEDIT_HUB_TIMEOUT, default 60)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise HubError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds", f"unset {TIMEOUT_ENV} or set e.g. 60")
    return value


@contextmanager
def hub_session() -> Iterator[None]:
    """Hub calls with a timeout (huggingface_hub's client waits forever by default, so a server that accepts and
    never answers would hang push) and without the library's log lines (retry warnings) on stderr; both are
    restored afterwards."""
    import httpx2
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http  # the factory in use has no public getter
    from huggingface_hub.utils import logging as hf_logging

    seconds = hub_timeout()
    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", _http.default_client_factory)

    def with_timeout() -> Any:
        client = previous()
        client.timeout = httpx2.Timeout(seconds, connect=min(seconds, 15.0))
        return client

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    set_client_factory(with_timeout)
    try:
        yield
    finally:
        set_client_factory(previous)
        hf_logging.set_verbosity(verbosity)


@contextmanager
def hub_errors(repo_id: str, token: str | None = None, revision: str | None = None) -> Iterator[None]:
    """Run Hub calls under `hub_session` (timeouts, quiet) and turn any Hub/network failure into one HubError line;
    the token is scrubbed from every message."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    def scrub(text: str) -> str:
        text = text.strip().splitlines()[0] if text.strip() else ""
        return text.replace(token, "***") if token else text

    def translate(err: BaseException) -> HubError | None:
        if isinstance(err, HubError):
            return err
        if isinstance(err, RevisionNotFoundError):
            return HubError(f"revision {revision!r} not found in {repo_id}", "check the branch name or commit")
        if isinstance(err, RemoteEntryNotFoundError):
            return HubError(f"{repo_id} has no such file ({scrub(str(err))})", "is it a headedit export?")
        if isinstance(err, RepositoryNotFoundError):
            return HubError(f"repo {repo_id} not found on {constants.ENDPOINT} (or it is private to another account)",
                            "check the repo id, or use a token of an account that can see it")
        if isinstance(err, HfHubHTTPError):
            status = err.response.status_code if err.response is not None else None
            detail = scrub(err.response.headers.get("X-Error-Message", "") if err.response is not None else "") \
                or scrub(str(err))
            if status == 401:
                return HubError("the Hub rejected the token (401 unauthorized)", _LOGIN_HINT)
            if status == 403:
                return HubError(f"the Hub refused to write to {repo_id} (403: {detail})",
                                "use a token with write access to that namespace, or push to your own namespace")
            if status == 404:
                return HubError(f"not found on the Hub: {repo_id} (404: {detail})", "check the repo id and revision")
            return HubError(f"the Hub answered {status}: {detail}", "try again later")
        if isinstance(err, OfflineModeIsEnabled):
            return HubError("HF_HUB_OFFLINE is set, so nothing can be sent to the Hub", "unset HF_HUB_OFFLINE")
        if isinstance(err, httpx2.TimeoutException):
            return HubError(f"the Hub at {constants.ENDPOINT} did not answer within {hub_timeout():g} s",
                            f"check your network connection or HF_ENDPOINT, or raise {TIMEOUT_ENV}")
        if isinstance(err, (httpx2.TransportError, httpx2.StreamError, OSError)):
            return HubError(f"cannot reach the Hub at {constants.ENDPOINT} ({type(err).__name__})",
                            "check your network connection or HF_ENDPOINT")
        if isinstance(err, (ValueError, TypeError, KeyError, AttributeError, IndexError)):
            # JSON that is HTML, an array where an object belongs, fields missing: not the Hub API answering
            return HubError(f"the server at {constants.ENDPOINT} gave an answer that is not the Hub API "
                            f"({type(err).__name__})", "check HF_ENDPOINT points at the Hugging Face Hub")
        if isinstance(err, RuntimeError):  # huggingface_hub wraps a failed upload ("Error while uploading ...")
            cause = translate(err.__cause__) if err.__cause__ is not None else None
            return cause or HubError(f"the upload to {repo_id} broke off ({scrub(str(err))})",
                                     "check your network connection or HF_ENDPOINT, then push again")
        return None

    try:
        with hub_session():  # every Hub call of the block has a timeout and keeps the library's logs off stderr
            yield
    except Exception as err:  # noqa: BLE001 - mapped by type; anything unknown is re-raised unchanged
        mapped = translate(err)
        if mapped is None:
            raise
        if mapped is err:
            raise
        raise mapped from None


def check_account(api: Any, repo_id: str) -> None:
    """Refuse early, with a clear line, a read-only token or a namespace the account cannot write to."""
    who = api.whoami()
    if not isinstance(who, dict) or not isinstance(who.get("name"), str) or not isinstance(who.get("orgs", []), list):
        raise TypeError("whoami did not answer an account")  # hub_errors: not the Hub API
    namespace = repo_id.split("/", 1)[0]
    allowed = {who.get("name")} | {org.get("name") for org in who.get("orgs", []) if isinstance(org, dict)}
    role = ((who.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError("the token is read-only, so it cannot push", "create a token with the write role and set HF_TOKEN")
    if namespace not in allowed:
        raise HubError(f"the token's account cannot write to namespace {namespace!r} (it belongs to another user or org)",
                       "push to your own namespace, e.g. --repo YOUR_NAME/" + repo_id.split("/", 1)[1])


def _retarget_card(opened: dict[str, Any], manifest: dict[str, Any], repo_id: str) -> None:
    """Upload the card re-rendered for `repo_id` (and the manifest hashing it) instead of the verified files,
    read from those same handles; the export folder on disk is not changed."""
    from headedit.export.card import CARD, retarget  # the card module loads only when pushing

    if CARD not in opened:
        return
    renamed = retarget(opened[CARD].read(), manifest, repo_id)
    opened[CARD].seek(0)
    if renamed is not None:
        for name, data in zip((CARD, MANIFEST), renamed):
            opened[name].close()
            opened[name] = io.BytesIO(data)


def push_export(
    export_dir: str | Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    message: str | None = None,
    force: bool = False,
    token: str | None = None,
    reporter: Reporter = null_reporter,
) -> str:
    """Verify, then upload an export folder to `repo_id` in one commit; return the commit URL."""
    export = Path(export_dir)
    check_repo_id(repo_id)
    if not export.is_dir():
        raise ExportError(f"export folder {export} not found", "pass the folder written by `headedit bake` or `headedit export`")
    reporter(StageStarted("push", total=3, description=f"publishing to {repo_id}"))
    from headedit.export.bake import verify_export  # lazy: bake's model-loading stack only when pushing

    manifest = verify_export(export)  # structure, every listed file present, no unlisted weights
    validation_passed(export, force, manifest)
    paths = upload_paths(export, manifest)
    extra = sorted(p.name for p in export.iterdir() if p.name not in paths and not p.name.startswith("."))
    if extra:
        reporter(Log(f"not uploaded (not listed in {MANIFEST}): {', '.join(extra)}", level="warning"))
    secret = hub_token(token)
    opened = open_verified(export, manifest, secret)  # each file read once: sha256 and secret scan on that read
    _retarget_card(opened, manifest, repo_id)
    reporter(StageProgress("push", done=1, total=3))
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    api = HfApi(token=secret)
    bars_were_off = are_progress_bars_disabled()
    disable_progress_bars()  # the library never prints; progress goes through events
    try:
        with hub_errors(repo_id, secret, revision):
            check_account(api, repo_id)
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            if revision and revision != "main":
                api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
            reporter(StageProgress("push", done=2, total=3))
            heads = manifest.get("heads", "")
            # uploaded from the files just verified, not re-opened by name
            operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=fh) for name, fh in opened.items()]
            info = api.create_commit(
                repo_id,
                operations,
                commit_message=message or f"headedit: ablate heads {heads or '(none)'}",
                revision=revision,
                repo_type="model",
            )
            url = str(info.commit_url)
    finally:
        for fh in opened.values():
            fh.close()
        if not bars_were_off:
            enable_progress_bars()
    reporter(StageFinished("push", summary=f"{len(paths)} files in one commit: {url}"))
    return url


def fetch_manifest(repo_id: str, revision: str | None = None, token: str | None = None) -> dict[str, Any]:
    """Read `headedit.json` of a pushed export from the Hub (for `headedit inspect NAMESPACE/NAME`)."""
    check_repo_id(repo_id)
    import httpx2
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

    with hub_errors(repo_id, token, revision):
        try:
            # Ask the Hub first: hf_hub_download alone would fall back to a cached copy even when the Hub
            # now answers "not found" (a repo made private, a token without access).
            sha = HfApi(token=token).model_info(repo_id, revision=revision).sha
        except (httpx2.TransportError, OSError) as err:
            try:  # offline: a manifest cached earlier is still the truth for that revision
                sha, path = None, hf_hub_download(repo_id, MANIFEST, revision=revision, token=token, local_files_only=True)
            except LocalEntryNotFoundError:
                raise err from None
        if sha is not None:
            try:
                path = hf_hub_download(repo_id, MANIFEST, revision=sha, token=token, repo_type="model")
            except RemoteEntryNotFoundError:
                raise HubError(f"{repo_id} has no {MANIFEST}, so it was not published by headedit",
                               "pass a repo pushed with `headedit push`") from None
    try:
        if Path(path).stat().st_size > 64 * 2**20:
            raise ValueError("too large for a manifest")
        manifest = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        raise HubError(f"{MANIFEST} in {repo_id} is not valid JSON", "re-push the export") from None
    if not isinstance(manifest, dict):
        raise HubError(f"{MANIFEST} in {repo_id} is not a manifest", "re-push the export")
    return manifest


__all__ = [
    "EXPORT_EXTRAS",
    "check_account",
    "check_repo_id",
    "fetch_manifest",
    "hub_errors",
    "hub_session",
    "hub_token",
    "push_export",
    "upload_paths",
    "validation_passed",
]
