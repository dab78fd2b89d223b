"""Bake a GGUF source: a safetensors checkpoint and an edited GGUF, both carrying the same head edit.

The safetensors side is the model as transformers dequantizes it (float32), with each chosen head's input
columns of the attention output projection zeroed, plus the config and tokenizer the GGUF implies: plain
`from_pretrained` loads it. The GGUF side is the source file with exactly those columns zeroed inside the
quantized blocks (`headedit.model.gguf_edit`), so llama.cpp-family runtimes load the edit directly; it is
verified bit for bit after writing, and a head whose columns do not fall on the format's block boundaries is
refused rather than requantized.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from headedit import __version__
from headedit.atomic import sha256_file
from headedit.events import Reporter, StageFinished, StageProgress, StageStarted, null_reporter
from headedit.model.gguf_edit import read_gguf_summary, write_edited_gguf, zero_columns_plan
from headedit.model.gguf_source import gguf_tokenizer, load_gguf_model
from headedit.model.gguf_verify import verify_edit
from headedit.model.heads import Head, HeadLayout, format_heads

ATTN_OUTPUT = "blk.{layer}.attn_output.weight"  # llama.cpp's name for every architecture's output projection


def gguf_columns(layout: HeadLayout, heads: Sequence[Head]) -> dict[str, list[tuple[int, int]]]:
    """{GGUF tensor name: input-column ranges} of a head set, from the one head geometry."""
    return {ATTN_OUTPUT.format(layer=layer): ranges for layer, ranges in layout.columns(heads).items()}


def check_gguf_edit(gguf: Path, layout: HeadLayout, heads: Sequence[Head]) -> None:
    """Refuse (ExportError, one line) a head set the GGUF's tensor types cannot zero exactly; reads the header only."""
    zero_columns_plan(read_gguf_summary(gguf), gguf_columns(layout, heads))


def bake_gguf_into(gguf: Path, layout: HeadLayout, heads: Sequence[Head], target: Path,
                   reporter: Reporter = null_reporter) -> dict[str, str]:
    """Write both checkpoints into `target`; return {source file name: sha256}."""
    import torch  # the dequantized model is a torch module
    from safetensors.torch import save_model

    columns = gguf_columns(layout, heads)
    check_gguf_edit(gguf, layout, heads)
    reporter(StageStarted("bake", total=3, description=f"zeroing {len(heads)} heads (GGUF source)"))
    model = load_gguf_model(gguf, torch.float32)
    with torch.no_grad():
        for layer, ranges in layout.columns(heads).items():
            weight = model.get_submodule(layout.o_proj_path(layer)).weight  # Linear: [out, heads * width]
            for start, stop in ranges:
                if layout.layer(layer).kind == "conv1d":  # Conv1D: [heads * width, out]
                    weight[start:stop, :] = 0
                else:
                    weight[:, start:stop] = 0
    # transformers refuses save_pretrained on a model it loaded from GGUF (it counts as quantized), although the
    # weights are plain floats now: write them with safetensors (shared tied tensors stored once) and the config.
    save_model(model, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.save_pretrained(target)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(target)
    gguf_tokenizer(gguf).save_pretrained(target)
    del model
    reporter(StageProgress("bake", done=1, total=3))
    record = {"heads": format_heads(heads), "version": __version__, "source_sha256": sha256_file(gguf)}
    edited = target / gguf.name
    write_edited_gguf(gguf, edited, columns, record)
    reporter(StageProgress("bake", done=2, total=3))
    verify_edit(gguf, edited, columns)
    reporter(StageProgress("bake", done=3, total=3))
    reporter(StageFinished("bake", summary=f"model.safetensors and {gguf.name} written (GGUF edit verified exact)"))
    return {gguf.name: record["source_sha256"]}


__all__ = ["bake_gguf_into", "check_gguf_edit", "gguf_columns", "ATTN_OUTPUT"]
