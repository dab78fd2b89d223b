"""Tiny random-weight models with a real byte-level tokenizer, for tests and benchmarks that run offline.

No tokenizer files can be downloaded here, so `tiny_tokenizer` builds one in code with the `tokenizers`
library: GPT-2 style byte-level BPE (every string round-trips), a hand-written merge list so a few words are
single tokens (` yes` and ` no` are, as in real vocabularies, so BoolQ is single-token), a BOS token added
to every encoding (as Llama's tokenizer does), and a chat template that understands `enable_thinking`
(as SmolLM3's does). Everything is deterministic: same code, same ids, same weights.
"""
from __future__ import annotations

from typing import Any

import torch

# Words that become single tokens, built by left-to-right merge chains. Order matters only for ranks.
_WORDS = (
    " no", " yes", " the", " is", " of", " and", " to", " in", " a", "Question", " Question", "Answer",
    " Answer", " What", " plus", " minus", " times", "ing", " that", " it", " was", " for", " on", " with",
    " he", " she", " they", " are", " be", " this", " not", " can", " will", " def", " return", "\n\n",
)
SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n{% endif %}{% endif %}"
)


def _byte_chars(text: str) -> list[str]:
    # GPT-2 byte -> printable char table, as the ByteLevel pre-tokenizer writes tokens.
    table = {b: c for b, c in zip(range(256), _bytes_to_unicode())}
    return [table[b] for b in text.encode("utf-8")]


def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    order = sorted(zip(bs, cs))
    return [chr(c) for _, c in order]


def tiny_tokenizer() -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` (vocab ~330) with BOS, EOS, pad and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = _bytes_to_unicode()
    vocab: dict[str, int] = {}
    for special in SPECIAL_TOKENS:
        vocab[special] = len(vocab)
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        chars = _byte_chars(word)
        left = chars[0]
        for ch in chars[1:]:
            merged = left + ch
            if merged not in vocab:
                merges.append((left, ch))
                vocab[merged] = len(vocab)
            left = merged
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    bos = SPECIAL_TOKENS[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[2],
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(arch: str = "llama", vocab_size: int | None = None, **overrides: Any) -> Any:
    """A small config of `arch` (llama, mistral, qwen2, qwen3, smollm3): 2 layers x 4 heads (2 KV), hidden 32."""
    import transformers

    classes = {
        "llama": "LlamaConfig",
        "mistral": "MistralConfig",
        "qwen2": "Qwen2Config",
        "qwen3": "Qwen3Config",
        "smollm3": "SmolLM3Config",
    }
    if arch not in classes:
        raise ValueError(f"tiny_config: unknown arch {arch!r}; one of {sorted(classes)}")
    if vocab_size is None:
        vocab_size = len(tiny_tokenizer())
    params: dict[str, Any] = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=vocab_size,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    params.update(overrides)
    config = getattr(transformers, classes[arch])(**params)
    config.architectures = [config.__class__.__name__.replace("Config", "ForCausalLM")]
    return config


def tiny_model(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    """A random-weight causal LM of `tiny_config(arch, **overrides)`, seeded, in eval mode.

    `init_scale` (default 0.2, larger than HF's 0.02) makes the logits peaked enough that greedy outputs are
    not all the same token, so exactness tests see a mix of right and wrong answers.
    """
    from transformers import AutoModelForCausalLM

    init_scale = float(overrides.pop("init_scale", 0.2))
    config = tiny_config(arch, **overrides)
    config.initializer_range = init_scale
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    if model.generation_config is not None:
        model.generation_config.pad_token_id = config.pad_token_id
    return model
