"""Where an edited model came from, for its card: the original Hub id and the licence, or an honest "unknown".

The Hub links a card to its base model (`base_model` + `base_model_relation`) and shows its licence; both
must be facts, never guesses. They are read, in order, from: a Hub source (its id; its card's licence), the
source folder's own files (a Hugging Face cache path `models--ORG--NAME`, README front matter, LICENSE text),
and GGUF metadata (`general.source.repo_url` / `general.source.huggingface.repository`, `general.license`).
Nothing here raises: a fact that cannot be read is left unknown, with the reason.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headedit.model.bundled import BUNDLED

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")
_HUB_URL = re.compile(r"^https?://(?:www\.)?huggingface\.co/(?!datasets/|spaces/)([\w.\-]+/[\w.\-]+?)(?:/.*)?/?$")
_CACHE_DIR = re.compile(r"^models--([\w.\-]+)--([\w.\-]+)$")
# Licence texts recognised by their first lines; anything else stays unknown rather than guessed.
_LICENCE_TEXTS = (("apache-2.0", ("Apache License", "Version 2.0")), ("mit", ("MIT License",)),
                  ("bsd-3-clause", ("BSD 3-Clause",)), ("gpl-3.0", ("GNU GENERAL PUBLIC LICENSE", "Version 3")))
BUNDLED_LICENCE = "apache-2.0"  # the bundled demo checkpoints are part of headedit, under its licence


@dataclass(frozen=True)
class Provenance:
    base_model: str | None  # the Hub id of the model that was edited, when known
    base_from: str  # how it was found, or why it is unknown
    license: str | None  # a Hub licence identifier, when known
    license_from: str


def hub_id_from_url(url: str) -> str | None:
    """`https://huggingface.co/ORG/NAME[/...]` -> `ORG/NAME`; other URLs -> None."""
    match = _HUB_URL.match(url.strip())
    return match.group(1) if match and HUB_ID.match(match.group(1)) else None


def _front_matter(text: str) -> dict[str, Any]:
    if not text.startswith("---"):
        return {}
    parts = text.split("---", 2)
    if len(parts) < 3:
        return {}
    try:
        import yaml  # a huggingface_hub dependency

        data = yaml.safe_load(parts[1])
    except Exception:  # a malformed card is not our error to report
        return {}
    return data if isinstance(data, dict) else {}


def _licence_of_text(text: str) -> str | None:
    head = text[:2000]
    for ident, needles in _LICENCE_TEXTS:
        if all(n in head for n in needles):
            return ident
    return None


def gguf_facts(path: Path) -> tuple[str | None, str | None]:
    """(original Hub id, licence) from a GGUF file's `general.*` metadata."""
    try:
        # lazy: only GGUF sources need the GGUF reader
        from headedit.model.gguf_edit import read_gguf_summary

        meta = read_gguf_summary(path).metadata
    except Exception:  # not a readable GGUF: no facts
        return None, None
    base = None
    repo = meta.get("general.source.huggingface.repository")
    if isinstance(repo, str) and HUB_ID.match(repo):
        base = repo
    for key in ("general.source.repo_url", "general.source.url"):
        value = meta.get(key)
        if base is None and isinstance(value, str):
            base = hub_id_from_url(value)
    lic = meta.get("general.license")
    return base, (lic.strip().lower() if isinstance(lic, str) and lic.strip() else None)


def folder_facts(folder: Path, readme: bool = True) -> tuple[str | None, str, str | None, str]:
    """(base id, how, licence, how) from a local model folder or GGUF file (`readme=False`: an export, whose
    README.md is our own card)."""
    base, base_from, lic, lic_from = None, "", None, ""
    if folder.is_file() and folder.suffix == ".gguf":
        base, lic = gguf_facts(folder)
        return base, "GGUF metadata" if base else "", lic, "GGUF metadata general.license" if lic else ""
    for part in [folder, *folder.parents][:4]:  # .../models--ORG--NAME/snapshots/<sha>
        match = _CACHE_DIR.match(part.name)
        if match:
            base, base_from = f"{match.group(1)}/{match.group(2)}", "Hugging Face cache folder name"
            break
    card = folder / "README.md"
    if readme and card.is_file():
        value = _front_matter(card.read_text(encoding="utf-8", errors="replace")).get("license")
        if isinstance(value, str) and value:
            lic, lic_from = value, "source README.md front matter"
    if lic is None:
        for file in sorted(folder.glob("LICENSE*")):
            lic = _licence_of_text(file.read_text(encoding="utf-8", errors="replace"))
            if lic:
                lic_from = f"source {file.name} text"
                break
    for file in sorted(folder.glob("*.gguf"))[:1]:
        g_base, g_lic = gguf_facts(file)
        if base is None and g_base:
            base, base_from = g_base, "GGUF metadata"
        if lic is None and g_lic:
            lic, lic_from = g_lic, "GGUF metadata general.license"
    return base, base_from, lic, lic_from


def hub_licence(repo_id: str, revision: str | None) -> str | None:
    """The licence in a Hub model's card: the cached copy first, then the Hub unless it is unreachable."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, "README.md", revision=revision)
        if isinstance(cached, str):
            value = _front_matter(Path(cached).read_text(encoding="utf-8", errors="replace")).get("license")
            if isinstance(value, str) and value:
                return value
        # lazy: only a Hub lookup needs the network probe
        from headedit.offline import hub_unreachable

        if hub_unreachable():
            return None
        from huggingface_hub import ModelCard

        value = ModelCard.load(repo_id, repo_type="model").data.get("license")
        return str(value) if isinstance(value, str) and value else None
    except Exception:  # gated, missing card, network failure: unknown, not a guess
        return None


def provenance(model_id: str | None, hub: bool, revision: str | None = None, export: Path | None = None) -> Provenance:
    """What is known about the edited model's origin; `export` adds its copied LICENSE files."""
    if model_id and model_id in BUNDLED:
        return Provenance(None, f"{model_id} is bundled with headedit (not a Hub model)", BUNDLED_LICENCE,
                          "headedit's licence (the bundled checkpoint is part of headedit)")
    if model_id and hub and HUB_ID.match(model_id):
        lic = hub_licence(model_id, revision)
        return Provenance(model_id, "Hub id of the source", lic,
                          "the source's Hub card" if lic else "the source's Hub card could not be read")
    base, base_from, lic, lic_from = None, "", None, ""
    if model_id:
        local = Path(model_id).expanduser()
        if local.exists():
            base, base_from, lic, lic_from = folder_facts(local)
    if lic is None and export is not None:
        _, _, lic, lic_from = folder_facts(export, readme=False)
        lic_from = lic_from.replace("source ", "copied ")
    return Provenance(base, base_from or "a local model without a Hub id in its files", lic,
                      lic_from or "no licence found in the source's files")


__all__ = ["Provenance", "provenance", "folder_facts", "gguf_facts", "hub_id_from_url", "HUB_ID"]
