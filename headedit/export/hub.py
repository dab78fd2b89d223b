"""Publish an export folder to the Hugging Face Hub, and read a manifest back from it.

Why a module of its own: every Hub failure (bad token, read-only token, someone else's namespace,
missing repo, unreachable endpoint) must become one `HubError` line with a hint, and the token must
never leave memory. The export is verified against its manifest before a byte is uploaded.
"""
from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from headedit.errors import ExportError, HubError
from headedit.events import Log, Reporter, StageFinished, StageProgress, StageStarted, null_reporter

MANIFEST = "headedit.json"
# Files an export may hold besides those bake hashed into the manifest (written later by `card`/`export`).
EXPORT_EXTRAS = ("README.md", "heads.png", "recipe.toml", "validation.json")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")
_LOGIN_HINT = "set HF_TOKEN to a valid token or run `hf auth login`"


def check_repo_id(repo_id: str) -> str:
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".git", ".")):
        raise HubError(f"invalid repo id {repo_id!r}", "use NAMESPACE/NAME, e.g. your-user/llama-edited")
    return repo_id


def _verify(export: Path) -> dict[str, Any]:
    """The export's manifest, after checking every listed file still has its recorded sha256."""
    from headedit.export.bake import verify_export

    return verify_export(export)


def validation_passed(export: Path, force: bool) -> None:
    path = export / "validation.json"
    if not path.is_file():
        if force:
            return
        raise ExportError(f"{export.name} has no validation.json, so its gain was never checked on held-out data",
                          "export it from a validated run (`headedit export RUN`) or pass --force")
    try:
        passed = json.loads(path.read_text(encoding="utf-8")).get("passed")
    except (json.JSONDecodeError, AttributeError):
        raise ExportError("validation.json in the export is corrupt", "re-export the run") from None
    if passed is not True and not force:
        raise ExportError("validation did not pass for this export (validation.json says passed: false)",
                          "push anyway with --force, or pick a different head set")


def upload_paths(export: Path, manifest: dict[str, Any]) -> list[str]:
    """Files that go up: everything the manifest hashes, the manifest, and the known export extras."""
    names = set(manifest.get("files", {})) | {MANIFEST}
    names |= {name for name in EXPORT_EXTRAS if (export / name).is_file()}
    return sorted(names)


def _refuse_leaks(export: Path, paths: list[str], secret: str) -> None:
    """Never publish the token: refuse if any non-weight file of the export contains it."""
    needle = secret.encode()
    for name in paths:
        if name.endswith(".safetensors"):
            continue
        if needle in (export / name).read_bytes():
            raise ExportError(f"refusing to push: {name} in the export contains your Hub token",
                              "remove the token from that file (and from the recipe it came from), then re-export")


def hub_token(token: str | None) -> str:
    if token:
        return token
    from huggingface_hub import get_token

    found = get_token()  # HF_TOKEN, then the login cache; never written anywhere by us
    if not found:
        raise HubError("no Hugging Face token found", _LOGIN_HINT)
    return found


@contextmanager
def hub_errors(repo_id: str, token: str | None = None, revision: str | None = None) -> Iterator[None]:
    """Turn any Hub/network failure into one HubError line; the token is scrubbed from every message."""
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

    try:
        yield
    except HubError:
        raise
    except RevisionNotFoundError:
        raise HubError(f"revision {revision!r} not found in {repo_id}", "check the branch name or commit") from None
    except RemoteEntryNotFoundError as err:
        raise HubError(f"{repo_id} has no such file ({scrub(str(err))})", "is it a headedit export?") from None
    except RepositoryNotFoundError:
        raise HubError(f"repo {repo_id} not found on {constants.ENDPOINT} (or it is private to another account)",
                       "check the repo id, or use a token of an account that can see it") from None
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        detail = scrub(err.response.headers.get("X-Error-Message", "") if err.response is not None else "") or scrub(str(err))
        if status == 401:
            raise HubError("the Hub rejected the token (401 unauthorized)", _LOGIN_HINT) from None
        if status == 403:
            raise HubError(f"the Hub refused to write to {repo_id} (403: {detail})",
                           "use a token with write access to that namespace, or push to your own namespace") from None
        if status == 404:
            raise HubError(f"not found on the Hub: {repo_id} (404: {detail})", "check the repo id and revision") from None
        raise HubError(f"the Hub answered {status}: {detail}", "try again later") from None
    except OfflineModeIsEnabled:
        raise HubError("HF_HUB_OFFLINE is set, so nothing can be sent to the Hub", "unset HF_HUB_OFFLINE") from None
    except (httpx2.TransportError, OSError) as err:
        raise HubError(f"cannot reach the Hub at {constants.ENDPOINT} ({type(err).__name__})",
                       "check your network connection or HF_ENDPOINT") from None


def check_account(api: Any, repo_id: str) -> None:
    """Refuse early, with a clear line, a read-only token or a namespace the account cannot write to."""
    who = api.whoami()
    namespace = repo_id.split("/", 1)[0]
    allowed = {who.get("name")} | {org.get("name") for org in who.get("orgs", []) if isinstance(org, dict)}
    role = ((who.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError("the token is read-only, so it cannot push", "create a token with the write role and set HF_TOKEN")
    if namespace not in allowed:
        raise HubError(f"the token's account cannot write to namespace {namespace!r} (it belongs to another user or org)",
                       "push to your own namespace, e.g. --repo YOUR_NAME/" + repo_id.split("/", 1)[1])


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
    manifest = _verify(export)
    validation_passed(export, force)
    paths = upload_paths(export, manifest)
    extra = sorted(p.name for p in export.iterdir() if p.is_file() and p.name not in paths)
    if extra:
        reporter(Log(f"not uploaded (not part of the export): {', '.join(extra)}", level="warning"))
    reporter(StageProgress("push", done=1, total=3))

    secret = hub_token(token)
    _refuse_leaks(export, paths, secret)
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

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
            operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(export / name)) for name in paths]
            info = api.create_commit(
                repo_id,
                operations,
                commit_message=message or f"headedit: ablate heads {heads or '(none)'}",
                revision=revision,
                repo_type="model",
            )
    finally:
        if not bars_were_off:
            enable_progress_bars()
    reporter(StageFinished("push", summary=f"{len(paths)} files in one commit: {info.commit_url}"))
    return str(info.commit_url)


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
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise HubError(f"{MANIFEST} in {repo_id} is not valid JSON", "re-push the export") from None
    if not isinstance(manifest, dict):
        raise HubError(f"{MANIFEST} in {repo_id} is not a manifest", "re-push the export")
    return manifest


__all__ = ["push_export", "fetch_manifest", "check_repo_id", "upload_paths", "hub_errors", "EXPORT_EXTRAS"]
