"""Tiny random model folders on disk (safetensors + tokenizer): what `load_model` and the CLI accept."""
from __future__ import annotations

from pathlib import Path

# The coin-test model: small enough that a full discover takes seconds, with GQA so head slicing is exercised.
COIN_MODEL = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=32)


def save_tiny(folder: Path, seed: int = 0, **overrides: object) -> Path:
    """`headedit.bench.tiny.tiny_model(seed, **overrides)` and its tokenizer, saved to `folder`."""
    from headedit.bench.tiny import tiny_model, tiny_tokenizer

    folder = Path(folder)
    tiny_model(seed=seed, **overrides).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder


def save_coin_model(folder: Path, seed: int = 0, **overrides: object) -> Path:
    """The tiny Llama the discovery/pipeline tests run coin-test on (COIN_MODEL, then `overrides`)."""
    return save_tiny(folder, seed=seed, **{**COIN_MODEL, **overrides})


# Small decoders of the families the bake tests run on: name -> (transformers config class, extra kwargs).
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "llama-gqa": ("LlamaConfig", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2}),
    "qwen3-headdim": ("Qwen3Config", {"num_key_value_heads": 2, "head_dim": 12}),  # head_dim != hidden/heads
    "smollm3": ("SmolLM3Config", {"num_key_value_heads": 2}),
}


def family_model(arch: str, seed: int = 0):
    """A 3-layer, 4-head random model of FAMILIES[arch], weights widened so an ablated head visibly moves logits."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    cls_name, extra = FAMILIES[arch]
    kwargs = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=64, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    kwargs.update(extra)
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # random init is small; widen every matrix so an ablated head visibly moves the logits
        for p in model.parameters():
            p.mul_(8.0 if p.dim() == 2 else 1.0)
    return model


def save_model(model, folder: Path, max_shard_size: str | None = None) -> Path:
    """`model.save_pretrained(folder)` (sharded when `max_shard_size` is given); returns the folder."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return folder
