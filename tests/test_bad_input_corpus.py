"""Bad input corpus: every row runs the real CLI in a subprocess and must fail cleanly.

For each case: exit code 2, exactly one line on stderr (`headedit: error: <problem> (<how to fix>)`), no
traceback, nothing created or changed on disk (the whole tmp tree and the source model are hashed before
and after; no half-made run or export folder), nothing created on the local Hub, and the token never echoed.
The cases run in a small thread pool (each subprocess pays the interpreter + torch import).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 3
MAX_STDERR_LINE = 400  # one readable line, not a dump

# A valid recipe as {section: {key: TOML literal}}; each recipe case changes one thing.
BASE_RECIPE: dict[str, dict[str, str]] = {
    "": {"name": '"bad-input"'},
    "model": {"id": '"{model}"', "dtype": '"float32"', "device": '"cpu"', "batch_size": "8"},
    "task": {"name": '"copy-second"', "discovery": "16", "heldout": "16", "seed": "0"},
    "discovery": {"screen": '"single"', "candidates": "4", "max_heads": "2", "early_stop": "false"},
    "validation": {"bootstrap": "200"},
    "export": {"out": '"exports/bad-input"'},
}


def recipe(set: Mapping[str, str] | None = None, drop: tuple[str, ...] = ()) -> str:
    """BASE_RECIPE with `section.key` literals set/added and `section.key` (or `[section]`) dropped."""
    doc = {section: dict(keys) for section, keys in BASE_RECIPE.items()}
    for dotted, literal in (set or {}).items():
        section, _, key = dotted.rpartition(".")
        doc.setdefault(section, {})[key] = literal
    for dotted in drop:
        if dotted.startswith("["):
            doc.pop(dotted.strip("[]"))
        else:
            section, _, key = dotted.rpartition(".")
            doc[section].pop(key)
    lines = [f"{k} = {v}" for k, v in doc.pop("", {}).items()]
    for section, keys in doc.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {v}" for k, v in keys.items())
    return "\n".join(lines) + "\n"


@dataclass
class Shared:
    """Inputs every case may read (and must leave untouched)."""

    model: Path  # tiny Llama, safetensors + tokenizer
    export: Path  # a baked export with card and validation (pushable)
    run: Path  # a finished-looking run folder (recipe, run.json, journal, selection)
    user: str
    token: str
    read_token: str
    other_user: str
    dead_endpoint: str


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # placeholders: {case} {model} {export} {run} {user} {other}
    expect: str  # must appear in the error line (names the problem)
    files: Mapping[str, str | bytes] = field(default_factory=dict)  # written under {case} first ({model} expanded)
    setup: Callable[[Path, Shared], None] | None = None
    env: Mapping[str, str | None] = field(default_factory=dict)  # None removes the variable
    repo: str | None = None  # a hub repo that must not exist afterwards


def discover(text: str, expect: str, id: str, **kw) -> Case:
    return Case(id, ("discover", "{case}/r.toml", "--out", "{case}/run"), expect, files={"r.toml": text}, **kw)


# ---- setups that build bad model folders / runs / exports from the shared good ones --------------
def copy_model(case: Path, shared: Shared, name: str = "m") -> Path:
    return Path(shutil.copytree(shared.model, case / name))


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def model_without_config(case: Path, shared: Shared) -> None:
    (copy_model(case, shared) / "config.json").unlink()


def model_bad_config_json(case: Path, shared: Shared) -> None:
    (copy_model(case, shared) / "config.json").write_text('{"model_type": "llama", ')


def model_truncated(case: Path, shared: Shared) -> None:
    weights = copy_model(case, shared) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def model_garbage_header(case: Path, shared: Shared) -> None:
    (copy_model(case, shared) / "model.safetensors").write_bytes(b"\xff" * 64)


def model_pickle_only(case: Path, shared: Shared) -> None:
    import torch
    from safetensors.torch import load_file

    folder = copy_model(case, shared)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def model_no_o_proj(case: Path, shared: Shared) -> None:
    """A real Mamba checkpoint: no attention heads at all, so nothing headedit could zero."""
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(num_hidden_layers=1, hidden_size=16, state_size=4, vocab_size=64)
    MambaForCausalLM(config).save_pretrained(case / "m")


def model_remote_code(case: Path, shared: Shared) -> None:
    folder = copy_model(case, shared)
    edit_config(folder, auto_map={"AutoModelForCausalLM": "evil.EvilModel"})
    (folder / "evil.py").write_text("raise SystemExit('remote code ran')\n")


def model_absurd(case: Path, shared: Shared) -> None:
    edit_config(copy_model(case, shared), num_attention_heads=10**9, num_key_value_heads=10**9)


def model_mismatched(case: Path, shared: Shared) -> None:
    edit_config(copy_model(case, shared), head_dim=4)  # weights were written for head_dim 8


def model_empty(case: Path, shared: Shared) -> None:
    (case / "m").mkdir()


def out_exists(case: Path, shared: Shared) -> None:
    (case / "out").mkdir()
    (case / "out" / "keep.txt").write_text("mine\n")


def copy_run(case: Path, shared: Shared) -> Path:
    return Path(shutil.copytree(shared.run, case / "run"))


def run_newer(case: Path, shared: Shared) -> None:
    run = copy_run(case, shared)
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "format": 99}))


def run_garbage_journal(case: Path, shared: Shared) -> None:
    (copy_run(case, shared) / "journal.sqlite").write_bytes(b"this is not a database\n" * 200)


def run_truncated_journal(case: Path, shared: Shared) -> None:
    journal = copy_run(case, shared) / "journal.sqlite"
    journal.write_bytes(journal.read_bytes()[:3000])


def run_corrupt_run_json(case: Path, shared: Shared) -> None:
    (copy_run(case, shared) / "run.json").write_text('{"format": 1, "name": ')


def run_no_selection(case: Path, shared: Shared) -> None:
    (copy_run(case, shared) / "selection.json").unlink()


def run_unvalidated(case: Path, shared: Shared) -> None:
    (copy_run(case, shared) / "validation.json").unlink()


def not_a_run(case: Path, shared: Shared) -> None:
    (case / "run").mkdir()
    (case / "run" / "notes.txt").write_text("just a folder\n")


def copy_export(case: Path, shared: Shared) -> Path:
    return Path(shutil.copytree(shared.export, case / "export"))


def export_tampered(case: Path, shared: Shared) -> None:
    weights = copy_export(case, shared) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))


def export_missing_file(case: Path, shared: Shared) -> None:
    (copy_export(case, shared) / "tokenizer.json").unlink()


def export_extra_weights(case: Path, shared: Shared) -> None:
    export = copy_export(case, shared)
    shutil.copy2(export / "model.safetensors", export / "model-extra.safetensors")


def export_no_manifest(case: Path, shared: Shared) -> None:
    (copy_export(case, shared) / "headedit.json").unlink()


def export_corrupt_manifest(case: Path, shared: Shared) -> None:
    (copy_export(case, shared) / "headedit.json").write_text("{not json")


def export_failed_validation(case: Path, shared: Shared) -> None:
    from headedit.export.bake import write_manifest

    export = copy_export(case, shared)
    validation = json.loads((export / "validation.json").read_text())
    (export / "validation.json").write_text(json.dumps({**validation, "passed": False}))
    manifest = json.loads((export / "headedit.json").read_text())
    write_manifest(export, {k: v for k, v in manifest.items() if k != "files"})  # consistent, so only `passed` refuses


BAKE = ("bake", "{case}/m", "--heads", "0.1", "--out", "{case}/out")
PUSH = ("push", "{export}", "--repo", "{user}/corpus")


# ---- issue 18: hostile inputs of every class (secrets, binding, run trust, size bounds, internal errors) -----
def write_safetensors(path: Path, header: object, data: bytes = b"") -> None:
    """A safetensors file with exactly this header (any JSON), for headers no writer would produce."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def model_config_raw(text: str) -> Callable[[Path, Shared], None]:
    def setup(case: Path, shared: Shared) -> None:
        config = json.loads((shared.model / "config.json").read_text())
        folder = copy_model(case, shared)
        (folder / "config.json").write_text(json.dumps(config)[:-1] + ", " + text + "}")
    return setup


def model_header(header: object) -> Callable[[Path, Shared], None]:
    def setup(case: Path, shared: Shared) -> None:
        write_safetensors(copy_model(case, shared) / "model.safetensors", header, b"\0" * 64)
    return setup


def model_index(weight_map: object) -> Callable[[Path, Shared], None]:
    def setup(case: Path, shared: Shared) -> None:
        folder = copy_model(case, shared)
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return setup


def model_side_file_links_out(case: Path, shared: Shared) -> None:
    (case / "private.txt").write_text("a private file next to the model, not part of it\n")
    (copy_model(case, shared) / "LICENSE.txt").symlink_to(case / "private.txt")


def model_weights_link_out(case: Path, shared: Shared) -> None:
    folder = copy_model(case, shared)
    (folder / "model.safetensors").rename(case / "weights.safetensors")
    (folder / "model.safetensors").symlink_to(case / "weights.safetensors")


def model_without_tokenizer(case: Path, shared: Shared) -> None:
    folder = copy_model(case, shared)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        (folder / name).unlink(missing_ok=True)


def model_without_chat_template(case: Path, shared: Shared) -> None:
    folder = copy_model(case, shared)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def model_tokenizer_fifo(case: Path, shared: Shared) -> None:
    folder = copy_model(case, shared)
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")


def model_previous_heads(heads: str) -> Callable[[Path, Shared], None]:
    def setup(case: Path, shared: Shared) -> None:
        (copy_model(case, shared) / "headedit.json").write_text(json.dumps({"format": 1, "heads": heads, "files": {}}))
    return setup


def rebind(export: Path) -> None:
    """Re-hash an edited export and bind its validation to it: consistent, so only the case's own defect refuses."""
    from headedit.export.bake import write_manifest
    from headedit.export.outgoing import checkpoint_record

    manifest = json.loads((export / "headedit.json").read_text())
    manifest = write_manifest(export, {k: v for k, v in manifest.items() if k != "files"})
    validation = json.loads((export / "validation.json").read_text())
    (export / "validation.json").write_text(json.dumps({**validation, "checkpoint": checkpoint_record(manifest)}))
    write_manifest(export, {k: v for k, v in manifest.items() if k != "files"})


def export_weights_hold_token(case: Path, shared: Shared) -> None:
    from safetensors.torch import load_file, save_file

    export = copy_export(case, shared)
    tensors = load_file(export / "model.safetensors")
    save_file(tensors, export / "model.safetensors", metadata={"format": "pt", "by": shared.token})
    rebind(export)


def export_config_holds_any_token(case: Path, shared: Shared) -> None:
    export = copy_export(case, shared)
    edit_config(export, _commit_token="hf_" + "AbCdEfGhIj" * 3 + "Klmn")
    rebind(export)


def export_file_links_out(case: Path, shared: Shared) -> None:
    export = copy_export(case, shared)
    (case / "outside.json").write_text((export / "config.json").read_text())
    (export / "config.json").unlink()
    (export / "config.json").symlink_to(case / "outside.json")
    rebind(export)


def export_other_heads_validation(case: Path, shared: Shared) -> None:
    """An export of heads 1.3 carrying (listed in its manifest) the validation of the run that chose 0.1,1.2."""
    from headedit.export.bake import bake, write_manifest

    export = bake(shared.model, "1.3", case / "export")
    shutil.copy2(shared.export / "validation.json", export / "validation.json")
    manifest = json.loads((export / "headedit.json").read_text())
    write_manifest(export, {k: v for k, v in manifest.items() if k != "files"})


def export_unlisted_validation(case: Path, shared: Shared) -> None:
    export = copy_export(case, shared)
    manifest = json.loads((export / "headedit.json").read_text())
    del manifest["files"]["validation.json"]
    (export / "headedit.json").write_text(json.dumps(manifest))


def run_edit(name: str, change: Callable[[object], object]) -> Callable[[Path, Shared], None]:
    """A copied run whose JSON file `name` is replaced by change(its content)."""
    def setup(case: Path, shared: Shared) -> None:
        path = copy_run(case, shared) / name
        path.write_text(json.dumps(change(json.loads(path.read_text()) if path.is_file() else None)))
    return setup


def run_recipe_changed(case: Path, shared: Shared) -> None:
    recipe = copy_run(case, shared) / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("seed = 0", "seed = 7"))


def run_journal_sql(sql: str) -> Callable[[Path, Shared], None]:
    def setup(case: Path, shared: Shared) -> None:
        import sqlite3

        db = sqlite3.connect(copy_run(case, shared) / "journal.sqlite")
        try:
            with db:
                db.execute(sql)
        finally:
            db.close()  # the last connection: sqlite folds its -wal/-shm files back in
    return setup


def out_is_file(case: Path, shared: Shared) -> None:
    (case / "out").write_text("not a folder\n")


def out_symlink_loop(case: Path, shared: Shared) -> None:
    (case / "loop").symlink_to(case / "loop")


def data_file(content: bytes) -> Callable[[Path, Shared], None]:
    def setup(case: Path, shared: Shared) -> None:
        (case / "data" / "boolq").mkdir(parents=True)
        (case / "data" / "boolq" / "validation.jsonl").write_bytes(content)
    return setup


def fifo_recipe(case: Path, shared: Shared) -> None:
    os.mkfifo(case / "r.toml")


EVAL = ("eval", "{model}", "--task", "boolq", "--data-dir", "{case}/data", "--limit", "4")
RESUME = ("discover", "--resume", "{case}/run")


def issue_18_cases() -> list[Case]:
    """New cases for each class of issue 18 (beyond the review's own examples)."""
    good = '[1.0, 2.0]'
    return [
        # 2. secrets: links out of the source, tokens anywhere in what push would upload
        Case("bake-side-file-links-out", BAKE, "LICENSE.txt is a link to outside the model folder",
             setup=model_side_file_links_out),
        Case("bake-weights-link-out", BAKE, "model.safetensors is a link to outside", setup=model_weights_link_out),
        Case("push-weights-header-holds-token", ("push", "{case}/export", "--repo", "{user}/corpus"),
             "model.safetensors in the export contains a Hugging Face token", setup=export_weights_hold_token),
        Case("push-config-holds-any-hf-token", ("push", "{case}/export", "--repo", "{user}/corpus"),
             "config.json in the export contains a Hugging Face token", setup=export_config_holds_any_token),
        Case("push-export-file-links-out", ("push", "{case}/export", "--repo", "{user}/corpus"),
             "config.json is a link to outside the export", setup=export_file_links_out),
        # 3. the validation vouches only for its own checkpoint
        Case("push-validation-of-other-heads", ("push", "{case}/export", "--repo", "{user}/corpus", "--force"),
             "validation.json is for heads '0.1,1.2' but this export ablates '1.3'",
             setup=export_other_heads_validation),
        Case("push-validation-not-in-manifest", ("push", "{case}/export", "--repo", "{user}/corpus"),
             "validation.json its headedit.json does not list", setup=export_unlisted_validation),
        # 5. run folders are checked, never trusted, and nothing is written before they are
        Case("resume-recipe-changed", RESUME, "recipe.toml of run", setup=run_recipe_changed),
        Case("resume-selection-array", RESUME, "selection.json is a JSON list", setup=run_edit("selection.json", lambda d: [1])),
        Case("validate-run-json-task-text", ("validate", "{case}/run"), "has task of type str",
             setup=run_edit("run.json", lambda d: {**d, "task": "copy-second"})),
        Case("validate-run-json-other-task", ("validate", "{case}/run"), "run.json names task 'boolq'",
             setup=run_edit("run.json", lambda d: {**d, "task": {"name": "boolq"}})),
        Case("resume-journal-bits-short", RESUME, "bytes of correctness bits for n = 16",
             setup=run_journal_sql("UPDATE evaluations SET correct_bits = x'ff' WHERE heads = '0.1'")),
        # 6. bounded before expanded or read
        Case("heads-range-of-a-billion", ("bake", "{model}", "--heads", "0.0-999999999", "--out", "{case}/out"),
             "outside any model"),
        Case("bake-source-manifest-huge-range", BAKE, "0.0-999999999", setup=model_previous_heads("0.0-999999999")),
        Case("recipe-is-dev-zero", ("discover", "/dev/zero", "--out", "{case}/run"), "not a regular file"),
        Case("recipe-is-a-fifo", ("discover", "{case}/r.toml", "--out", "{case}/run"), "not a regular file",
             setup=fifo_recipe),
        discover(recipe({"model.id": '"{case}/m"'}), "tokenizer.json in the model folder is not a regular file",
                 "discover-tokenizer-is-a-fifo", setup=model_tokenizer_fifo),
        # 7. internal errors that must be one line
        Case("model-config-infinity", BAKE, "non-finite number Infinity",
             setup=model_config_raw('"num_hidden_layers": Infinity')),
        Case("model-config-huge-float", BAKE, "non-finite number 1e999", setup=model_config_raw('"rope_theta": 1e999')),
        Case("model-config-heads-as-text", BAKE, "num_attention_heads='4', not an integer",
             setup=model_config_raw('"num_attention_heads": "4"')),
        Case("model-header-json-array", BAKE, "the header is not a JSON object", setup=model_header([1, 2])),
        Case("model-header-huge-tensor", BAKE, "claims shape",
             setup=model_header({"x": {"dtype": "F32", "shape": [10**12, 10**12], "data_offsets": [0, 64]}})),
        Case("model-header-infinite-offset", BAKE, "not a valid safetensors file",
             setup=model_header({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, float("inf")]}})),
        Case("model-index-weight-map-list", BAKE, "weight_map that is not an object",
             setup=model_index(["model.safetensors"])),
        Case("model-index-shard-escapes", BAKE, "'../escape.safetensors' as a shard",
             setup=model_index({"x": "../escape.safetensors"})),
        Case("heads-5000-digits", ("bake", "{model}", "--heads", "1" * 5000 + ".0", "--out", "{case}/out"),
             "malformed head"),
        Case("bake-out-is-a-file", (*BAKE[:4], "--out", "{case}/out", "--force"), "is a file, not a folder",
             setup=lambda case, shared: (copy_model(case, shared), out_is_file(case, shared)) and None),
        Case("bake-out-under-symlink-loop", ("bake", "{model}", "--heads", "0.1", "--out", "{case}/loop/out"),
             "cannot be resolved", setup=out_symlink_loop),
        Case("bake-out-dot-force", ("bake", "{model}", "--heads", "0.1", "--out", ".", "--force"), "current folder"),
        Case("eval-json-is-a-folder", (*EVAL, "--json", "{case}"), "is a folder", setup=data_file(b'{"a": 1}\n')),
        Case("validate-json-is-a-folder", ("validate", "{run}", "--json", "{case}"), "is a folder"),
        Case("data-row-is-an-array", EVAL, "line 2 is a JSON list, not an object",
             setup=data_file(b'{"passage": "p", "question": "q", "answer": true}\n' + good.encode() + b"\n")),
        Case("data-not-utf8", EVAL, "line 1 is not UTF-8", setup=data_file(b'{"passage": "\xff\xfe"}\n')),
        Case("data-nested-100k-deep", EVAL, "nested too deeply", setup=data_file(b"[" * 100_000 + b"]" * 100_000)),
        Case("push-token-not-ascii", PUSH, "characters no token has",
             env={"HF_TOKEN": "hf_t\u00f6k\u00e9n_\u00fcmlaut_1234567890"}, repo="{user}/corpus"),
        # 8. refused before a run folder exists
        discover(recipe({"model.id": '"{case}/m"'}), "no usable tokenizer", "discover-model-without-tokenizer",
                 setup=model_without_tokenizer),
        discover(recipe({"model.device": '"cuda:99"'}), "cuda:99", "discover-device-cuda-99"),
        discover(recipe({"model.id": '"{case}/m"', "task.chat": "true"}), "has no chat template",
                 "discover-chat-without-template", setup=model_without_chat_template),
        Case("run-export-out-root", ("run", "{case}/r.toml", "--out", "{case}/run", "--force"), "export folder / ",
             files={"r.toml": recipe({"export.out": '"/"'})}),
        discover(recipe({"export.out": '"/"'}), "is the file-system root", "discover-export-out-root"),
        Case("discover-export-out-is-a-file", ("discover", "{case}/r.toml", "--out", "{case}/run"),
             "is a file, not a folder", files={"r.toml": recipe({"export.out": '"{case}/taken"'}),
                                               "taken": "a file where the export would go\n"}),
        # 9. smaller ones
        Case("bake-heads-empty", ("bake", "{model}", "--heads", "", "--out", "{case}/out"), "--allow-empty"),
        Case("eval-data-file-empty", EVAL, "holds no rows", setup=data_file(b"\n\n")),
        Case("model-vocab-absurd", BAKE, "vocab_size=1000000000000", setup=model_config_raw('"vocab_size": 1000000000000')),
        Case("model-vocab-mismatch", BAKE, "vocab_size 65 but model.embed_tokens.weight has shape",
             setup=model_config_raw('"vocab_size": 65')),
    ]


def cases() -> list[Case]:
    c: list[Case] = []
    # ---- recipes -------------------------------------------------------------------------------
    c += [
        discover('name = "x\n[model]\n', "not valid TOML", "toml-unterminated-string"),
        discover(recipe() + '[model]\nid = "again"\n', "not valid TOML", "toml-duplicate-table"),
        discover(recipe(drop=("name",)), "name is missing", "missing-name"),
        discover(recipe(drop=("[model]",)), "[model] is missing", "missing-model-table"),
        discover(recipe(drop=("model.id",)), "model.id is missing", "missing-model-id"),
        discover(recipe(drop=("task.name",)), "task.name is missing", "missing-task-name"),
        discover(recipe({"model.id": "42"}), "model.id must be", "model-id-mistyped"),
        discover(recipe({"model.dtype": '"float8"'}), "model.dtype must be", "dtype-unknown"),
        discover(recipe({"model.trust_remote_code": '"yes"'}), "model.trust_remote_code must be", "trust-mistyped"),
        discover(recipe({"model.batch_size": "0"}), "model.batch_size must be", "batch-size-zero"),
        discover(recipe({"model.chat_template_kwargs": "{ enable_thinking = false }"}),
                 "model.chat_template_kwargs has no effect", "chat-kwargs-without-chat"),
        discover(recipe({"task.discovery": "0"}), "task.discovery must be", "discovery-size-zero"),
        discover(recipe({"task.discovery": '"many"'}), "task.discovery must be", "discovery-size-mistyped"),
        discover(recipe({"task.heldout": "-5"}), "task.heldout must be", "heldout-negative"),
        discover(recipe({"discovery.screen": '"psychic"'}), "discovery.screen must be", "screen-unknown"),
        discover(recipe({"discovery.max_heads": "9"}), "discovery.max_heads", "max-heads-over-candidates"),
        discover(recipe({"discovery.early_stop_alpha": "1.0"}), "early_stop_alpha must be", "alpha-out-of-range"),
        discover(recipe({"discovery.compressed_fraction": "nan"}), "compressed_fraction must be", "fraction-nan"),
        discover(recipe({"validation.alpha": "0.9"}), "validation.alpha must be", "validation-alpha-range"),
        discover(recipe({"validation.side_tasks": '["no-such-task"]'}), "unknown task", "side-task-unknown"),
        discover(recipe({"export.repo_id": '"no-slash"'}), "export.repo_id must be", "repo-id-malformed"),
        discover(recipe({"colour": '"blue"'}), "colour is not a recipe field", "unknown-top-level-key"),
        discover(recipe({"discovery.turbo": "true"}), "discovery.turbo is not a recipe field", "unknown-section-key"),
        discover(recipe({"model": '"x"'}, drop=("[model]",)), "model must be a table", "section-not-a-table"),
        discover(recipe({"task.name": '"no-such-task"'}), "unknown task 'no-such-task'", "task-unknown"),
        Case("recipe-not-found", ("discover", "{case}/nope.toml", "--out", "{case}/run"), "not found"),
        Case("recipe-not-utf8", ("discover", "{case}/r.toml", "--out", "{case}/run"), "not UTF-8",
             files={"r.toml": b'name = "\xff\xfe"\n'}),
        # sizes the task's data cannot give (copy-second has 1000 discovery and 2000 held-out pairs)
        discover(recipe({"task.discovery": "1001"}), "1001", "discovery-larger-than-data"),
        discover(recipe({"task.heldout": "5000"}), "5000", "heldout-larger-than-data"),
    ]
    # ---- models (through bake, and through discover where a run folder could be left behind) ---
    c += [
        Case("model-path-missing", BAKE, "not found"),
        Case("model-path-empty", BAKE, "no config.json", setup=model_empty),
        Case("model-path-is-file", BAKE, "is a file", files={"m": "not a folder\n"}),
        Case("model-no-config", BAKE, "no config.json", setup=model_without_config),
        Case("model-config-not-json", BAKE, "config.json is not valid JSON", setup=model_bad_config_json),
        Case("model-truncated-safetensors", BAKE, "not a valid safetensors", setup=model_truncated),
        Case("model-pickle-only", BAKE, "pickle", setup=model_pickle_only),
        Case("model-no-o-proj", BAKE, "unsupported architecture", setup=model_no_o_proj),
        Case("model-absurd-heads", BAKE, "outside 1..1024", setup=model_absurd),
        Case("model-mismatched-shapes", BAKE, "o_proj.weight has shape", setup=model_mismatched),
        Case("model-hub-id-unreachable", ("bake", "nobody/nothing", "--heads", "0.1", "--out", "{case}/out"),
             "could not be fetched", env={"HF_ENDPOINT": "{dead}"}),
        Case("heads-malformed", ("bake", "{model}", "--heads", "0.x", "--out", "{case}/out"), "0.x"),
        Case("heads-layer-outside", ("bake", "{model}", "--heads", "7.0", "--out", "{case}/out"), "7"),
        Case("heads-head-outside", ("bake", "{model}", "--heads", "0.9", "--out", "{case}/out"), "0.9"),
        Case("bake-out-exists", ("bake", "{model}", "--heads", "0.1", "--out", "{case}/out"), "already exists",
             setup=out_exists),
        Case("bake-out-inside-source", ("bake", "{case}/m", "--heads", "0.1", "--out", "{case}/m/edited"),
             "overlaps the source", setup=lambda case, shared: copy_model(case, shared) and None),
        discover(recipe({"model.id": '"{case}/nope"'}), "not found", "discover-model-missing"),
        discover(recipe({"model.id": '"{case}/m"'}), "no config.json", "discover-model-no-config",
                 setup=model_without_config),
        discover(recipe({"model.id": '"{case}/m"'}), "pickle", "discover-model-pickle-only", setup=model_pickle_only),
        discover(recipe({"model.id": '"{case}/m"'}), "remote code", "discover-model-remote-code",
                 setup=model_remote_code),
    ]
    # ---- run folders ---------------------------------------------------------------------------
    resume = ("discover", "--resume", "{case}/run")
    c += [
        Case("resume-missing-folder", resume, "does not exist"),
        Case("resume-not-a-run", resume, "not a headedit run folder", setup=not_a_run),
        Case("resume-newer-version", resume, "newer than this headedit", setup=run_newer),
        Case("resume-garbage-journal", resume, "journal", setup=run_garbage_journal),
        Case("resume-truncated-journal", resume, "journal", setup=run_truncated_journal),
        Case("resume-corrupt-run-json", resume, "run.json", setup=run_corrupt_run_json),
        Case("validate-not-a-run", ("validate", "{case}/run"), "not a headedit run folder", setup=not_a_run),
        Case("validate-newer-version", ("validate", "{case}/run"), "newer than this headedit", setup=run_newer),
        Case("validate-garbage-journal", ("validate", "{case}/run"), "journal", setup=run_garbage_journal),
        Case("export-not-a-run", ("export", "{case}/run", "--out", "{case}/out"), "not a headedit run folder",
             setup=not_a_run),
        Case("export-newer-version", ("export", "{case}/run", "--out", "{case}/out"), "newer than this headedit",
             setup=run_newer),
        Case("export-no-selection", ("export", "{case}/run", "--out", "{case}/out"), "selection",
             setup=run_no_selection),
    ]
    # ---- exports and the Hub -------------------------------------------------------------------
    push_case = ("push", "{case}/export", "--repo", "{user}/corpus")
    c += [
        Case("push-export-tampered", push_case, "no longer matches", setup=export_tampered),
        Case("push-export-file-missing", push_case, "tokenizer.json", setup=export_missing_file),
        Case("push-export-extra-weights", push_case, "model-extra.safetensors", setup=export_extra_weights),
        Case("push-export-no-manifest", push_case, "headedit.json", setup=export_no_manifest),
        Case("push-export-missing", ("push", "{case}/nope", "--repo", "{user}/corpus"), "not found"),
        Case("push-validation-failed", push_case, "validation did not pass", setup=export_failed_validation),
        Case("push-no-token", PUSH, "no Hugging Face token", env={"HF_TOKEN": None}, repo="{user}/corpus"),
        Case("push-bad-token", PUSH, "rejected the token", env={"HF_TOKEN": "hf_bogusBOGUSbogus1234567890"},
             repo="{user}/corpus"),
        Case("push-read-only-token", PUSH, "read-only", env={"HF_TOKEN": "{read_token}"}, repo="{user}/corpus"),
        Case("push-other-users-namespace", ("push", "{export}", "--repo", "{other}/theirs"), "cannot write to namespace",
             repo="{other}/theirs"),
        Case("push-unreachable-endpoint", PUSH, "cannot reach the Hub", env={"HF_ENDPOINT": "{dead}"},
             repo="{user}/corpus"),
        Case("push-repo-id-malformed", ("push", "{export}", "--repo", "../escape"), "invalid repo id"),
        Case("export-push-unvalidated", ("export", "{case}/run", "--out", "{case}/out", "--push", "{user}/via-export"),
             "no validation.json", setup=run_unvalidated, repo="{user}/via-export"),
        Case("export-push-bad-token", ("export", "{run}", "--out", "{case}/out", "--push", "{user}/via-export"),
             "rejected the token", env={"HF_TOKEN": "hf_bogusBOGUSbogus1234567890"}, repo="{user}/via-export"),
    ]
    return c + issue_18_cases()


# ---- machinery -------------------------------------------------------------------------------------
def snapshot(root: Path, with_mtime: bool = False) -> dict[str, tuple]:
    """Every file and folder under `root`: folders by name, files by sha256 (and mtime when asked)."""
    out: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISFIFO(path.stat().st_mode):  # never read (it would block): its presence is the state
            out[rel] = ("fifo",)
        elif path.is_dir():
            out[rel] = ("dir",)
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[rel] = ("file", digest, path.stat().st_mtime_ns) if with_mtime else ("file", digest)
    return out


def diff(before: dict, after: dict) -> list[str]:
    changes = [f"+{k}" for k in after.keys() - before.keys()] + [f"-{k}" for k in before.keys() - after.keys()]
    changes += [f"~{k}" for k in before.keys() & after.keys() if before[k] != after[k]]
    return sorted(changes)


def cli_flags() -> set[str]:
    """Every option any `headedit` subcommand accepts: a hint may only tell the user to pass one of these."""
    from headedit.cli import build_parser

    parser = build_parser()
    flags = {o for a in parser._actions for o in a.option_strings}
    for action in parser._subparsers._group_actions:  # the subcommands
        for sub in action.choices.values():
            flags |= {o for a in sub._actions for o in a.option_strings}
    return flags


def fill(text: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def make_run(folder: Path, model: Path, builders_run: Path) -> Path:
    """A run folder as `headedit discover` leaves it: recipe, run.json, a real journal, screen and selection."""
    import numpy as np

    from headedit.journal import Journal
    from headedit.runs import Run

    text = fill(recipe(), {"model": str(model)})
    run = Run.create(folder, text, {"headedit_version": "0.1.0", "name": "bad-input",
                                    "model": {"id": str(model), "revision": None, "sha256": {}}})
    with Journal(run.file("journal.sqlite")) as journal:
        rng = np.random.default_rng(0)
        for heads in ("", "0.1", "1.2", "0.1,1.2"):
            journal.put("discovery", heads, rng.random(16) > 0.5, "screen", 16)
    run.write("selection.json", {"heads": "0.1,1.2", "discovery_acc": 0.6, "intact_acc": 0.5, "gain_points": 10.0})
    validation = json.loads((builders_run / "validation.json").read_text())
    run.write("validation.json", {**validation, "n": 16, "passed": True})
    (folder / "lock").touch()
    return folder


@pytest.fixture(scope="module")
def shared_inputs(tmp_path_factory) -> tuple[Path, Path, Path]:
    sys.path.insert(0, str(Path(__file__).parent))
    from hub.builders import make_export

    root = tmp_path_factory.mktemp("corpus-shared")
    source, fake_run, export = make_export(root)
    return source, export, make_run(root / "good-run", source, fake_run)


def _run_case(case: Case, case_dir: Path, shared: Shared, base_env: dict[str, str]) -> subprocess.CompletedProcess:
    values = {"case": str(case_dir), "model": str(shared.model), "export": str(shared.export), "run": str(shared.run),
              "user": shared.user, "other": shared.other_user, "read_token": shared.read_token,
              "dead": shared.dead_endpoint}
    env = dict(base_env)
    for key, value in case.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = fill(value, values)
    argv = [fill(a, values) for a in case.argv]
    return subprocess.run([sys.executable, "-m", "headedit", *argv], cwd=case_dir, env=env, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.slow
def test_bad_input_corpus(tmp_path, shared_inputs, hub_server, hub_user, hub_env):
    source, export, run = shared_inputs
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    other = hub_user.name + "-other"
    hub_server.add_user(other)
    shared = Shared(source, export, run, hub_user.name, hub_user.token, hub_user.read_token, other, dead)
    table = cases()
    assert len(table) >= 40 and len({c.id for c in table}) == len(table)
    base_env = {**hub_env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    only = os.environ.get("CORPUS_ONLY")  # developer aid: CORPUS_ONLY=id1,id2

    dirs: dict[str, Path] = {}
    for case in table:
        if only and case.id not in only.split(","):
            continue
        case_dir = tmp_path / "cases" / case.id
        case_dir.mkdir(parents=True)
        values = {"model": str(source), "case": str(case_dir)}
        for name, content in case.files.items():
            target = case_dir / name
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(fill(content, values))
        if case.setup:
            case.setup(case_dir, shared)
        dirs[case.id] = case_dir

    sources = {p: snapshot(p, with_mtime=True) for p in (source, export, run)}
    before_tree = snapshot(tmp_path)
    repos_before = set(hub_server.state.repos)
    selected = [c for c in table if c.id in dirs]
    flags = cli_flags()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = dict(zip((c.id for c in selected),
                           pool.map(lambda c: _run_case(c, dirs[c.id], shared, base_env), selected)))

    after_tree = snapshot(tmp_path)
    problems: list[str] = []
    for case in selected:
        res = results[case.id]
        lines = res.stderr.splitlines()
        prefix = f"tmp/cases/{case.id}/"
        changed = [d for d in diff({k: v for k, v in before_tree.items() if k.startswith(f"cases/{case.id}")},
                                   {k: v for k, v in after_tree.items() if k.startswith(f"cases/{case.id}")})]
        why = []
        if res.returncode != 2:
            why.append(f"exit {res.returncode}")
        if len(lines) != 1:
            why.append(f"{len(lines)} stderr lines")
        if "Traceback" in res.stderr + res.stdout:
            why.append("traceback")
        line = lines[0] if lines else ""
        if not line.startswith("headedit: error: ") or len(line) > MAX_STDERR_LINE:
            why.append("not a `headedit: error:` line of readable length")
        if not line.rstrip().endswith(")") or "(" not in line:
            why.append("no hint in parentheses (how to fix it)")
        if fill(case.expect, {"user": shared.user}) not in line:
            why.append(f"does not name the problem ({case.expect!r})")
        unknown = [f for f in re.findall(r"(?<![\w-])--[a-z][a-z-]*", line) if f not in flags]
        if unknown:
            why.append(f"hint names options the CLI does not have: {unknown}")
        if changed:
            why.append(f"disk changed: {changed[:6]}".replace(prefix, ""))
        if case.repo and fill(case.repo, {"user": shared.user, "other": other}) in hub_server.state.repos:
            why.append("a hub repo was created")
        secrets = (hub_user.token, hub_user.read_token)
        if any(s in res.stderr + res.stdout for s in secrets):
            why.append("token echoed")
        if why:
            problems.append(f"{case.id}: {'; '.join(why)}\n    stderr: {res.stderr.strip()[-600:]!r}")

    mine = ("cases/", "hf_home")  # per-case folders are checked above; hf_home is the client's cache
    outside = diff({k: v for k, v in before_tree.items() if not k.startswith(mine)},
                   {k: v for k, v in after_tree.items() if not k.startswith(mine)})
    untouched = {str(p): diff(snap, snapshot(p, with_mtime=True)) for p, snap in sources.items()}
    assert not problems, f"{len(problems)} of {len(selected)} cases failed:\n" + "\n".join(problems)
    assert outside == [], outside
    assert all(not d for d in untouched.values()), untouched
    assert set(hub_server.state.repos) == repos_before
