"""Model card: every section, front matter through huggingface_hub, heatmap PNG, and no local secrets."""
from __future__ import annotations

import getpass
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from headedit.export.card import render_card, scrub, template_path, write_card
from headedit.errors import ExportError, RunError
from headedit.export.heatmap_png import decode_png, heatmap_rgb

SECTIONS = ["## Results", "## Side effects on other tasks", "## Ablated heads", "## How the heads were found",
            "## Usage", "## Limitations", "## Reproduce"]
FAKE_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def test_card_has_every_section_and_measured_numbers(hub_export):
    _, run, export = hub_export
    text = (export / "README.md").read_text()
    for section in SECTIONS:
        assert section in text, section
    meta = _front_matter(text)
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert set(meta["tags"]) == {"headedit", "head-ablation", "copy-second"}
    assert "base_model" not in meta  # a local-only source has no hub id to name
    assert "license" not in meta and "verified" not in text
    results = meta["model-index"][0]["results"]
    validation = json.loads((run / "validation.json").read_text())
    main = results[0]
    assert main["dataset"]["split"] == "heldout" and main["metrics"][0]["value"] == validation["edited_acc"]
    assert results[1]["metrics"][0]["value"] == validation["side_tasks"][0]["edited_acc"]
    # Results table row as in the paper: intact, edited, gain, relative error reduction, n, CI, McNemar p.
    assert "| copy-second | 25.00% | 40.62% | +15.62 | 20.8% | 128 | [+7.80, +23.40] | 4.20e-04 |" in text
    assert "| copy-first | 50.00% | 43.75% | -6.25 | 128 | [-12.50, -0.80] | 0.031 |" in text
    assert "- layer 0, head 1" in text and "- layer 1, head 2" in text and "![Layer x head" in text
    assert "copy-first degraded: 50.00% -> 43.75%" in text
    assert 'AutoModelForCausalLM.from_pretrained("' in text and "trust_remote_code=True" not in text
    manifest = json.loads((export / "headedit.json").read_text())
    assert manifest["files"]["model.safetensors"] in text
    for name, digest in manifest["source"]["files"].items():
        assert digest in text
    assert '[task]\nname = "copy-second"\ndiscovery_n = 64' in text  # recipe verbatim (paths scrubbed)
    assert "| transformers | 5.24.0 |" in text and "n=64, seed 7" in text and "14." in text


def test_card_front_matter_passes_the_hub_validator(hub_inprocess, hub_export):
    from huggingface_hub import HfApi

    _, _, export = hub_export
    HfApi(token=False)._validate_yaml((export / "README.md").read_text())  # raises ValueError when invalid
    with pytest.raises(ValueError):
        HfApi(token=False)._validate_yaml("---\nmodel-index: [{results: 3}]\n---\nbad\n")


def test_no_local_path_user_name_or_token_in_card(hub_export, monkeypatch, tmp_path):
    _, run, export = hub_export
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    user = getpass.getuser()
    recipe = (run / "recipe.toml").read_text()
    (run / "recipe.toml").write_text(
        recipe + f'\n[data]\ndir = "{Path.home()}/datasets/{user}"\ncache = "~/hf/cache"\n'
        f'note = "token {FAKE_TOKEN} from C:\\\\Users\\\\{user}\\\\hf"\n')
    run_json = json.loads((run / "run.json").read_text())
    run_json["task"]["data_note"] = f"read from {tmp_path} by {user} with token {FAKE_TOKEN}"
    (run / "run.json").write_text(json.dumps(run_json))
    card_path = write_card(export, run, repo_id="someone/tiny-edited")
    for path in export.rglob("*"):  # everything that will be published: card, recipe copy, manifest...
        if path.is_file():
            data = path.read_bytes()
            assert FAKE_TOKEN.encode() not in data and str(tmp_path).encode() not in data, path
    assert "<local path>" in (export / "recipe.toml").read_text()
    text = card_path.read_text()
    assert str(tmp_path) not in text and str(Path.home()) not in text and str(export) not in text
    assert "~/hf" not in text and "C:\\" not in text and "hf_" not in text
    if len(user) >= 2:
        assert not any(user == word.strip("`\"'.,:()[]/") for word in text.split()), user
    assert "<local path>" in text and 'from_pretrained("someone/tiny-edited")' in text


def test_scrub_keeps_hub_ids_and_urls():
    text = scrub("see https://huggingface.co/org/model and org/model; file /home/x/y.txt; ratio 3/4",
                 keep=("org/model",))
    assert "https://huggingface.co/org/model" in text and "org/model;" in text and "3/4" in text
    assert "/home/x" not in text


def test_hub_source_gets_base_model_and_its_licence(hub_inprocess, hub_user, hub_export, tmp_path):
    from huggingface_hub import HfApi

    _, run, export = hub_export
    api = HfApi(token=hub_user.token)
    source_repo = f"{hub_user.name}/tiny-source"
    api.create_repo(source_repo)
    api.upload_file(path_or_fileobj=b"---\nlicense: apache-2.0\n---\n# tiny source\n", path_in_repo="README.md",
                    repo_id=source_repo)
    manifest = json.loads((export / "headedit.json").read_text())
    manifest["source"] = {**manifest["source"], "id": source_repo, "hub": True}
    (export / "headedit.json").write_text(json.dumps(manifest))
    card = render_card(export, run)
    assert card.data.base_model == source_repo and card.data.license == "apache-2.0"
    assert f"`{source_repo}`" in str(card)


def test_write_card_extends_manifest_and_checks_heads(hub_export):
    from headedit.export.bake import verify_export

    _, run, export = hub_export
    manifest = verify_export(export)  # README.md, heads.png, recipe, validation are hashed and still match
    assert {"README.md", "heads.png", "recipe.toml", "validation.json"} <= set(manifest["files"])
    validation = json.loads((run / "validation.json").read_text())
    (run / "validation.json").write_text(json.dumps({**validation, "heads": "0.0"}))
    with pytest.raises(ExportError, match="validated heads"):
        write_card(export, run)
    (run / "validation.json").unlink()
    with pytest.raises(RunError, match="validation.json"):
        write_card(export, run)
    verify_export(export)  # refused writes left the export consistent


def test_heatmap_png_pixels(hub_export):
    _, run, export = hub_export
    screen = json.loads((run / "screen.json").read_text())
    img = decode_png((export / "heads.png").read_bytes())
    cell = img.shape[0] // 2
    assert img.shape == (2 * cell, 4 * cell, 3)
    assert np.array_equal(img, heatmap_rgb(screen["delta"], [(0, 1), (1, 2)]))
    centre = lambda layer, head: img[layer * cell + cell // 2, head * cell + cell // 2]  # noqa: E731
    assert tuple(centre(0, 1)) == (230, 97, 1)  # the largest gain: full orange
    assert centre(1, 0)[2] > centre(1, 0)[0]  # a loss: blue
    assert tuple(centre(0, 0)) == (255, 255, 255)  # no change: white
    assert tuple(img[0 * cell + cell // 2, 1 * cell + 1]) == (0, 0, 0)  # ablated head framed in black
    assert tuple(img[1 * cell + cell // 2, 0 * cell + 1]) != (0, 0, 0)  # a head not ablated is not framed


def test_card_command_writes_into_export(hub_export, capsys):
    from headedit.cli import main

    _, run, export = hub_export
    assert 'from_pretrained("someone/model")' not in (export / "README.md").read_text()
    assert main(["card", str(run), "--export", str(export), "--repo", "someone/model"]) == 0
    assert 'from_pretrained("someone/model")' in (export / "README.md").read_text()
    assert main(["card", str(run), "--export", str(export / "missing")]) == 2
    assert "export folder" in capsys.readouterr().err


def test_template_ships_with_the_package():
    assert template_path().is_file() and template_path().name == "headedit.md"
