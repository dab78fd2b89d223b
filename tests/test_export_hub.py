"""Publishing against a real local Hub-compatible HTTP server: push, reload, revisions, privacy, errors."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from headedit.errors import ExportError, HeadeditError, HubError
from headedit.export.hub import fetch_manifest, push_export, upload_paths

ROOT = Path(__file__).resolve().parent.parent

# Runs with transformers only: any attempt to import headedit fails, proving a user needs nothing else.
LOADER = r"""
import importlib.abc, sys
class _NoHeadedit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "headedit" or name.startswith("headedit."):
            raise ImportError("loading a pushed model must not need headedit")
sys.meta_path.insert(0, _NoHeadedit())
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
repo, rev, out = sys.argv[1], sys.argv[2] or None, sys.argv[3]
model = AutoModelForCausalLM.from_pretrained(repo, revision=rev, dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(repo, revision=rev)
ids = tok("copy the second word: red blue green", return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(ids).logits
save_file({"ids": ids.contiguous(), "logits": logits.contiguous()}, out)
assert not any(m == "headedit" or m.startswith("headedit.") for m in sys.modules)
"""


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headedit", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=240)


def _local_logits(export: Path, ids):  # noqa: ANN001, ANN202
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def _all_bytes_under(folder: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in folder.rglob("*") if p.is_file()]


def test_cli_push_then_plain_transformers_reload_gives_identical_logits(hub_server, hub_user, hub_env, hub_export, tmp_path):
    _, run, export = hub_export
    repo = f"{hub_user.name}/tiny-copy-edited"
    pushed = _cli(["push", str(export), "--repo", repo, "--message", "first edit"], hub_env)
    assert pushed.returncode == 0, pushed.stderr
    commit_url = pushed.stdout.strip().splitlines()[-1]
    assert commit_url.startswith(f"{hub_server.url}/{repo}/commit/")

    # One commit with exactly the verified export files, byte for byte.
    repo_state = hub_server.state.repos[repo]
    head = repo_state.resolve("main")
    assert head.summary == "first edit" and commit_url.endswith(head.sha)
    manifest = json.loads((export / "headedit.json").read_text())
    assert sorted(p for p in head.files if p != ".gitattributes") == upload_paths(export, manifest)
    assert {"README.md", "heads.png", "headedit.json", "recipe.toml", "validation.json", "model.safetensors",
            "config.json", "tokenizer.json"} <= set(head.files)
    assert head.files["model.safetensors"].lfs and head.files["heads.png"].lfs and not head.files["config.json"].lfs
    from headedit.export.card import retarget

    expected = {name: (export / name).read_bytes() for name in head.files if name != ".gitattributes"}
    renamed = retarget(expected["README.md"], manifest, repo)  # push uploads the card re-rendered for the repo
    assert renamed is not None and f'from_pretrained("{repo}")'.encode() in renamed[0]
    expected["README.md"], expected["headedit.json"] = renamed
    for name, data in expected.items():
        assert hub_server.file_bytes(repo, name) == data, name
    assert manifest == json.loads((export / "headedit.json").read_text())  # the local export is left as it was

    out = tmp_path / "remote_logits.safetensors"
    loaded = subprocess.run([sys.executable, "-c", LOADER, repo, "", str(out)], env=hub_env, text=True,
                            capture_output=True, timeout=240)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    from safetensors.torch import load_file

    remote = load_file(out)
    local = _local_logits(export, remote["ids"])
    assert remote["logits"].shape == local.shape
    assert (remote["logits"] == local).all()  # bit-identical, not approximately equal
    assert hub_server.unhandled() == []

    # The token was used but never written: not in the export, the run, the client cache or the pushed repo.
    token = hub_user.token.encode()
    for folder in (export, run, Path(hub_env["HF_HOME"])):
        for path, data in _all_bytes_under(folder):
            assert token not in data, path
    for commit in repo_state.commits.values():
        for name in commit.files:
            assert token not in hub_server.file_bytes(repo, name, commit.sha), name
    assert hub_user.token not in pushed.stdout + pushed.stderr + loaded.stdout + loaded.stderr


def test_second_commit_and_pinned_revision(hub_inprocess, hub_user, hub_export):
    from huggingface_hub import HfApi, hf_hub_download

    from headedit.export.card import write_card

    _, run, export = hub_export
    repo = f"{hub_user.name}/pinned"
    first = push_export(export, repo, token=hub_user.token, message="v1")
    first_sha = first.rsplit("/", 1)[-1]
    old_card = (export / "README.md").read_text()

    write_card(export, run, repo_id=repo)  # re-rendered card now names the repo in its usage snippet
    events = []
    second = push_export(export, repo, token=hub_user.token, reporter=events.append)
    second_sha = second.rsplit("/", 1)[-1]
    assert second_sha != first_sha
    assert any(type(e).__name__ == "StageFinished" and e.stage == "push" for e in events)

    api = HfApi(token=hub_user.token)
    assert [c.commit_id for c in api.list_repo_commits(repo)][:2] == [second_sha, first_sha]
    pinned = Path(hf_hub_download(repo, "README.md", revision=first_sha, token=hub_user.token)).read_text()
    latest = Path(hf_hub_download(repo, "README.md", token=hub_user.token)).read_text()
    # push re-renders the card for the repo it goes to: the first commit already names it, the local card did not
    assert f'from_pretrained("{repo}")' in pinned and 'from_pretrained("your-username/' in old_card
    assert f'from_pretrained("{repo}")' in latest

    # A branch push leaves main alone; the manifest reads back from either.
    branch = push_export(export, repo, token=hub_user.token, revision="experiment", message="on a branch")
    refs = {b.name: b.target_commit for b in api.list_repo_refs(repo).branches}
    assert refs["main"] == second_sha and refs["experiment"] == branch.rsplit("/", 1)[-1]
    local_manifest = json.loads((export / "headedit.json").read_text())
    assert fetch_manifest(repo, token=hub_user.token) == local_manifest
    assert fetch_manifest(repo, revision="experiment")["heads"] == "0.1,1.2"
    with pytest.raises(HubError) as err:
        fetch_manifest(repo, revision="no-such-branch")
    assert "no-such-branch" in str(err.value) and "\n" not in str(err.value)


def test_private_repo_is_invisible_to_another_token(hub_inprocess, hub_user, hub_export):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    _, _, export = hub_export
    repo = f"{hub_user.name}/secret"
    push_export(export, repo, private=True, token=hub_user.token)
    assert hub_inprocess.state.repos[repo].private
    assert fetch_manifest(repo, token=hub_user.token)["heads"] == "0.1,1.2"

    other = hub_inprocess.add_user(hub_user.name + "-other")
    for token in (other, None):
        with pytest.raises(RepositoryNotFoundError):
            HfApi(token=token or False).model_info(repo)
        with pytest.raises(HubError) as err:
            fetch_manifest(repo, token=token)
        assert "not found" in str(err.value) and "\n" not in str(err.value)


def test_bad_read_only_and_foreign_tokens_are_refused(hub_inprocess, hub_user, hub_export):
    _, _, export = hub_export
    repo = f"{hub_user.name}/refused"
    cases = {
        "hf_this_token_does_not_exist_123": "rejected the token (401",
        hub_user.read_token: "read-only",
        hub_inprocess.add_user("someone-else"): "cannot write to namespace",
    }
    for token, expected in cases.items():
        with pytest.raises(HubError) as err:
            push_export(export, repo, token=token)
        text = str(err.value)
        assert expected in text and "\n" not in text and token not in text
    assert repo not in hub_inprocess.state.repos  # nothing was created by any refused push


def test_server_side_403_on_someone_elses_repo_maps_to_one_line(hub_inprocess, hub_user):
    """Past headedit's own whoami check, the Hub's 403 on a foreign repo still becomes one HubError line."""
    from huggingface_hub import CommitOperationAdd, HfApi

    from headedit.export.hub import hub_errors

    owner = hub_inprocess.add_user("owner-" + hub_user.name)
    repo = f"owner-{hub_user.name}/theirs"
    HfApi(token=owner).create_repo(repo)
    with pytest.raises(HubError) as err:
        with hub_errors(repo, hub_user.token):
            HfApi(token=hub_user.token).create_commit(
                repo, [CommitOperationAdd("x.txt", b"x")], commit_message="intrude")
    text = str(err.value)
    assert "403" in text and repo in text and "\n" not in text and hub_user.token not in text
    assert [p for p in hub_inprocess.state.repos[repo].resolve("main").files] == [".gitattributes"]


def test_failed_or_missing_validation_and_tampering_refuse_before_any_upload(hub_inprocess, hub_user, hub_export):
    from headedit.export.card import write_card

    _, run, export = hub_export
    repo = f"{hub_user.name}/unvalidated"
    validation = json.loads((run / "validation.json").read_text())
    (run / "validation.json").write_text(json.dumps({**validation, "passed": False}))
    write_card(export, run)  # the export now carries the failed validation (hashed in its manifest)
    with pytest.raises(ExportError, match="validation did not pass"):
        push_export(export, repo, token=hub_user.token)
    assert repo not in hub_inprocess.state.repos

    weights = export / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-4] + b"\0\0\0\1")
    with pytest.raises(ExportError, match="model.safetensors"):
        push_export(export, repo, token=hub_user.token, force=True)
    assert repo not in hub_inprocess.state.repos
    weights.write_bytes(original)

    # --force pushes an export whose validation failed, but never one that does not match its manifest.
    url = push_export(export, repo, token=hub_user.token, force=True)
    assert url.startswith(hub_inprocess.url)
    assert weights.read_bytes() == original  # the local export is untouched by pushing

    (export / "validation.json").unlink()
    manifest = json.loads((export / "headedit.json").read_text())
    del manifest["files"]["validation.json"]
    (export / "headedit.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="no validation.json"):
        push_export(export, repo, token=hub_user.token)


def test_invalid_repo_id_and_missing_token(hub_inprocess, hub_export, monkeypatch):
    _, _, export = hub_export
    for bad in ("noslash", "a/b/c", "../x", "ns/.."):
        with pytest.raises(HubError, match="invalid repo id"):
            push_export(export, bad, token="hf_whatever_123456")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(HubError, match="no Hugging Face token"):
        push_export(export, "someone/model")


def test_cli_errors_are_one_line_exit_2(hub_server, hub_user, hub_env, hub_export):
    _, _, export = hub_export
    with socket.socket() as sock:  # a port nothing listens on: the endpoint is unreachable
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**hub_env, "HF_ENDPOINT": dead}
    result = _cli(["push", str(export), "--repo", f"{hub_user.name}/offline"], env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headedit: error: cannot reach the Hub"), result.stderr
    assert "Traceback" not in result.stderr and hub_user.token not in result.stderr + result.stdout


def test_hub_error_is_a_headedit_error():
    assert issubclass(HubError, HeadeditError)


def test_push_refuses_an_export_that_contains_the_token(hub_inprocess, hub_user, hub_export):
    from headedit.export.bake import write_manifest

    _, _, export = hub_export
    recipe = export / "recipe.toml"
    recipe.write_text(recipe.read_text() + f'\n# token = "{hub_user.token}"\n')
    manifest = json.loads((export / "headedit.json").read_text())
    write_manifest(export, manifest)  # a consistent manifest, so only the leak check can refuse
    with pytest.raises(ExportError) as err:
        push_export(export, f"{hub_user.name}/leaky", token=hub_user.token)
    assert "recipe.toml" in str(err.value) and hub_user.token not in str(err.value)
    assert f"{hub_user.name}/leaky" not in hub_inprocess.state.repos


# ---- issue 18: what goes up is exactly what was validated, scanned byte for byte ------------------------------
def _rewrite_manifest(export: Path, rebind: bool = False) -> None:
    """Re-hash the export into its manifest (consistent, so only the check under test can refuse); with `rebind`,
    also re-bind its validation to the weights now there."""
    from headedit.export.bake import write_manifest
    from headedit.export.outgoing import checkpoint_record

    manifest = json.loads((export / "headedit.json").read_text())
    manifest = write_manifest(export, {k: v for k, v in manifest.items() if k != "files"})
    if rebind:
        validation = json.loads((export / "validation.json").read_text())
        (export / "validation.json").write_text(json.dumps({**validation, "checkpoint": checkpoint_record(manifest)}))
        write_manifest(export, {k: v for k, v in manifest.items() if k != "files"})


def _weights_with(export: Path, metadata: dict[str, str] | None = None, extra_key: str | None = None) -> None:
    """Rewrite the export's weights with extra safetensors metadata or an extra tensor name (header bytes only)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(export / "model.safetensors")
    if extra_key is not None:
        tensors[extra_key] = torch.zeros(1)
    save_file(tensors, export / "model.safetensors", metadata={"format": "pt", **(metadata or {})})


def test_push_scans_weight_headers_for_the_token_and_any_hf_token(hub_inprocess, hub_user, hub_export):
    _, _, export = hub_export
    repo = f"{hub_user.name}/leaky-weights"
    cases = [
        ({"note": f"pushed with {hub_user.token}"}, None),  # the pushing account's token, in the header metadata
        ({"t": hub_user.token[::-1]}, None),  # reversed
        (None, "hf_" + "Q" * 34 + ".weight"),  # anyone's token shape, as a tensor name
    ]
    for metadata, key in cases:
        _weights_with(export, metadata, key)
        _rewrite_manifest(export, rebind=True)
        with pytest.raises(ExportError) as err:
            push_export(export, repo, token=hub_user.token)
        text = str(err.value)
        assert "model.safetensors" in text and "token" in text and hub_user.token not in text, text
    assert repo not in hub_inprocess.state.repos


def test_bake_never_copies_source_metadata(tmp_path, hub_user):
    """The token in a source checkpoint's safetensors metadata does not travel into the export at all."""
    from hub.builders import make_source
    from safetensors import safe_open

    from headedit.export.bake import bake

    source = make_source(tmp_path / "source")
    _weights_with(source, {"uploaded_by": hub_user.token, "format": "pt"})
    out = bake(source, "0.1", tmp_path / "out")
    assert hub_user.token.encode() not in (out / "model.safetensors").read_bytes()
    with safe_open(str(out / "model.safetensors"), framework="pt") as reader:
        assert reader.metadata() == {"format": "pt"}
    second = bake(source, "0.1", tmp_path / "again")  # reproducible byte for byte (what validation binds to)
    assert (second / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_push_uploads_only_manifest_files_and_refuses_links_out(hub_inprocess, hub_user, hub_export, tmp_path):
    _, _, export = hub_export
    (export / "notes.txt").write_text("private notes, never listed in the manifest\n")
    url = push_export(export, f"{hub_user.name}/listed-only", token=hub_user.token)
    head = hub_inprocess.state.repos[f"{hub_user.name}/listed-only"].resolve("main")
    manifest = json.loads((export / "headedit.json").read_text())
    assert url.endswith(head.sha) and "notes.txt" not in head.files
    assert set(head.files) - {".gitattributes"} == set(manifest["files"]) | {"headedit.json"}

    secret = tmp_path / "secret.txt"
    secret.write_text("a private file outside the export\n")
    (export / "LICENSE.txt").symlink_to(secret)
    _rewrite_manifest(export)  # hashes the link's target: consistent, yet the file lives outside the export
    with pytest.raises(ExportError, match="LICENSE.txt is a link to outside the export"):
        push_export(export, f"{hub_user.name}/linked", token=hub_user.token)
    assert f"{hub_user.name}/linked" not in hub_inprocess.state.repos


def test_validation_is_bound_to_the_exported_checkpoint(hub_inprocess, hub_user, hub_export, tmp_path):
    """A validation of other heads, other source weights or other baked weights never vouches for an export,
    --force included; one without a checkpoint record (an older headedit) needs --force."""
    from hub.builders import bind_validation, make_run

    from headedit.export.bake import bake
    from headedit.export.card import write_card

    source, run, _ = hub_export
    other = bake(source, "1.3", tmp_path / "other")  # an export of heads 1.3 ...
    copied = (run / "validation.json").read_bytes()  # ... carrying the validation of 0.1,1.2
    (other / "validation.json").write_bytes(copied)
    _rewrite_manifest(other)
    for force in (False, True):
        with pytest.raises(ExportError, match="validation.json is for heads '0.1,1.2' but this export ablates '1.3'"):
            push_export(other, f"{hub_user.name}/mismatch", token=hub_user.token, force=force)

    # same heads, but the validation measured another source model's weights
    run13 = make_run(tmp_path / "run13", source, heads="1.3")
    bind_validation(run13, other)
    record = json.loads((run13 / "validation.json").read_text())
    record["checkpoint"]["source_files"] = {"model.safetensors": "0" * 64}
    (other / "validation.json").write_text(json.dumps(record))
    _rewrite_manifest(other)
    with pytest.raises(ExportError, match="other source model"):
        push_export(other, f"{hub_user.name}/mismatch", token=hub_user.token, force=True)

    # and the baked weights: a validation bound to 1.3's weights copied into an export whose weights differ
    record = json.loads((run13 / "validation.json").read_text())
    record["checkpoint"]["weight_files"]["model.safetensors"] = "f" * 64
    (other / "validation.json").write_text(json.dumps(record))
    _rewrite_manifest(other)
    with pytest.raises(ExportError, match="other baked weights"):
        push_export(other, f"{hub_user.name}/mismatch", token=hub_user.token, force=True)

    # an unbound validation (older headedit): refused, pushable only with --force
    del record["checkpoint"]
    (run13 / "validation.json").write_text(json.dumps(record))
    write_card(other, run13)
    with pytest.raises(ExportError, match="does not name the checkpoint"):
        push_export(other, f"{hub_user.name}/mismatch", token=hub_user.token)
    assert f"{hub_user.name}/mismatch" not in hub_inprocess.state.repos
    push_export(other, f"{hub_user.name}/mismatch", token=hub_user.token, force=True)

    # a bound validation pushes without --force
    bind_validation(run13, other)
    write_card(other, run13)
    push_export(other, f"{hub_user.name}/bound", token=hub_user.token)


HOSTILE: list[tuple[str, str, str, str | tuple[str, ...]]] = [  # (case, route, fault, expected in the error line)
    ("never-answers", "whoami", "hang", "did not answer within 2 s"),
    ("html-200", "whoami", "html", "not the Hub API"),
    ("json-array-whoami", "whoami", "json-array", "not the Hub API"),
    ("json-array-commit", "commit", "json-array", "not the Hub API"),
    ("killed-mid-upload", "lfs_put", "die", ("cannot reach the Hub", "broke off")),  # which depends on the retry
]


def test_hostile_hub_servers_give_one_line(hub_export, hub_env, tmp_path):
    """The real local Hub server made hostile per route: every push ends in one line and exit 2, within bounds
    (the killed server costs huggingface_hub's own retries, ~25 s), and writes nothing to the export."""
    from concurrent.futures import ThreadPoolExecutor

    from hub.server import LocalHubServer

    _, _, export = hub_export
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    servers = []

    def one(case: tuple[str, str, str, object]) -> tuple[str, subprocess.CompletedProcess[str], float]:
        name, route, fault, _ = case
        server = LocalHubServer(0).start()
        servers.append(server)
        server.faults[route] = fault
        token = server.add_user("hostile")
        env = {**hub_env, "HF_ENDPOINT": server.url, "HF_TOKEN": token, "HEADEDIT_HUB_TIMEOUT": "2",
               "HF_HOME": str(tmp_path / f"hf-{name}")}
        if name == "non-ascii-token":
            env["HF_TOKEN"] = "hf_t\u00f6k\u00e9n_with_umlauts_1234567890"
        import time

        start = time.monotonic()
        res = _cli(["push", str(export), "--repo", f"hostile/{name}"], env)
        return name, res, time.monotonic() - start

    cases = [*HOSTILE, ("non-ascii-token", "", "", "characters no token has")]
    try:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(one, cases))
    finally:
        for server in servers:
            server.stop()
    problems = []
    for (name, res, seconds), (_, _, _, expect) in zip(results, cases):
        lines = res.stderr.strip().splitlines()
        named = any(e in lines[0] for e in ((expect,) if isinstance(expect, str) else expect)) if lines else False
        if res.returncode != 2 or len(lines) != 1 or not named or "Traceback" in res.stderr or seconds > 90:
            problems.append(f"{name}: exit {res.returncode} after {seconds:.0f}s: {res.stderr[-800:]!r}")
    assert not problems, "\n".join(problems)
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before
