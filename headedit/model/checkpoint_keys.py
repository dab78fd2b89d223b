"""Which checkpoint key holds each layer's output projection weight: exact names, transformers' own renamings of
legacy layouts, then prefix-tolerant tails (a base model saved without `model.`, GPT-2 without `transformer.`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from headedit.model.walk import meta_model

if TYPE_CHECKING:  # the geometry imports this module; its type is only named here
    from headedit.model.geometry import HeadGeometry


def map_keys(geometry: HeadGeometry, keys: list[str]) -> dict[int, str]:
    """{layer: checkpoint key} for the projection weights found among `keys`."""
    wanted = {geometry.o_proj_weight_key(lay.layer): lay.layer for lay in geometry.attention_layers}
    found = {wanted[k]: k for k in keys if k in wanted}
    if len(found) == len(wanted):
        return found
    renamed = renamed_by_transformers(geometry, keys)
    for key, target in renamed.items():
        if target in wanted and wanted[target] not in found:
            found[wanted[target]] = key
    if len(found) == len(wanted):
        return found
    # checkpoint prefixes (base model saved without `model.`, legacy `language_model.model.`): match the
    # shortest unique tail that still holds the layer list and index
    for target, layer in wanted.items():
        if layer in found:
            continue
        parts = target.split(".")
        index = parts.index(str(layer))  # the tail keeps the layer list's name and the layer's index
        for cut in range(1, index):
            tail = ".".join(parts[cut:])
            hits = [k for k in keys if k == tail or k.endswith("." + tail)]
            if len(hits) == 1:
                found[layer] = hits[0]
            if hits:  # found, or ambiguous: a shorter tail would only match more
                break
    return found


def renamed_by_transformers(geometry: HeadGeometry, keys: list[str]) -> dict[str, str]:
    """{checkpoint key: model parameter name} for keys transformers renames on loading (legacy layouts).

    Uses transformers' own conversion mapping; keys it would assemble from several tensors (converters) are
    left out, so such a projection is reported missing rather than edited wrongly."""
    if not geometry.config_json:
        return {}
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key
    except ImportError:  # another transformers: exact and prefix matching still apply
        return {}
    try:
        model = meta_model(geometry.config_json)
        transforms = get_model_conversion_mapping(model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        state = model.state_dict()
        prefix = model.base_model_prefix
        out: dict[str, str] = {}
        for key in sorted(keys, key=dot_natural_key):
            new, pattern = rename_source_key(key, renamings, converters, prefix, state)
            if new not in state and key in state:
                new, pattern = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=state)
            if pattern is None and new != key:
                out[key] = new
        return out
    except Exception:  # internal API of transformers changed: fall back to exact and prefix matching
        return {}


__all__ = ["map_keys", "renamed_by_transformers"]
