"""General damage of an edit: how far the edited model's next-token predictions moved on neutral text.

Task accuracy says what an edit bought; this says what it cost everywhere else. On a fixed set of neutral
English passages (`headedit/data/neutral.txt`, written for headedit), the intact model's next-token
distribution P is recorded at every position, then compared with the edited model's Q on the same tokens:
KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)), in nats, averaged over positions. 0 means the edit left every
prediction unchanged; heretic reports the same quantity for its edits. Both models run one after the other
(validation never holds two), so the reference keeps the intact log-probabilities: at most MAX_TOKENS
positions x vocabulary, float32, on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported by the functions that run a model, not by importing this module
    import torch

NEUTRAL_FILE = "data/neutral.txt"
SOURCE = "headedit/data/neutral.txt: 12 everyday English passages written for headedit"
MAX_TOKENS = 512  # positions compared; at a 152k vocabulary the reference is 311 MB of float32
MAX_WINDOW = 128  # tokens per forward; passages longer than the model's context are cut into windows


def neutral_passages() -> list[str]:
    """The passages, in file order ('#' lines are comments, blank lines separate passages)."""
    text = resources.files("headedit").joinpath(NEUTRAL_FILE).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return [" ".join(block.split()) for block in "\n".join(lines).split("\n\n") if block.strip()]


@dataclass
class Reference:
    """The intact model's log-probabilities on the neutral windows, and the token ids they were computed on."""

    windows: list[list[int]]  # token ids per forward
    logprobs: torch.Tensor  # [positions, vocab] float32 on the CPU: every window's positions but its last


def _windows(model: Any, tokenizer: Any, max_tokens: int) -> list[list[int]]:
    """Token windows of the passages, each at most the model's context (and MAX_WINDOW), max_tokens predictions."""
    context = int(getattr(model.config, "max_position_embeddings", 0) or MAX_WINDOW)
    width = max(2, min(MAX_WINDOW, context))
    out: list[list[int]] = []
    budget = max_tokens
    for passage in neutral_passages():
        ids = list(tokenizer(passage, add_special_tokens=True, verbose=False)["input_ids"])
        for start in range(0, len(ids) - 1, width):
            window = ids[start:start + width]
            if len(window) < 2 or budget <= 0:
                continue
            window = window[: budget + 1]
            out.append(window)
            budget -= len(window) - 1
    return out


def _logprobs(model: Any, windows: list[list[int]]) -> torch.Tensor:
    """Next-token log-probabilities at every position but each window's last: [positions, vocab] on the CPU."""
    import torch

    device = model.get_input_embeddings().weight.device
    rows = []
    with torch.no_grad():
        for window in windows:
            ids = torch.tensor([window], dtype=torch.long, device=device)  # [1, len]
            logits = model(input_ids=ids).logits[0, :-1].float()  # [len - 1, vocab]
            rows.append(torch.log_softmax(logits, dim=-1).cpu())
    return torch.cat(rows, dim=0)  # [positions, vocab]


def reference(model: Any, tokenizer: Any, max_tokens: int = MAX_TOKENS) -> Reference:
    """Record the intact model's predictions on the neutral text."""
    windows = _windows(model, tokenizer, max_tokens)
    return Reference(windows, _logprobs(model, windows))


def kl_per_position(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) per row of two [positions, vocab] log-probability tables, in nats: [positions]."""
    import torch

    p = p_log.exp()
    terms = torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p))  # 0 log 0 = 0, also against Q = 0
    return terms.sum(dim=-1).clamp_min(0.0)  # rounding can go a hair below 0 for identical rows


def measure(ref: Reference, model: Any, tokenizer: Any | None = None) -> dict[str, Any]:
    """The damage record for validation.json: mean and largest KL(intact || edited) per token, and its source.

    `tokenizer`, when given, must tokenize the passages as the reference did (the baked checkpoint carries the
    source's tokenizer files, so it does).
    """
    if tokenizer is not None:
        again = _windows(model, tokenizer, sum(len(w) - 1 for w in ref.windows))
        if again != ref.windows:
            raise ValueError("the edited model's tokenizer splits the neutral text differently from the intact one")
    kl = kl_per_position(ref.logprobs, _logprobs(model, ref.windows))
    return record(float(kl.mean()) if kl.numel() else 0.0, float(kl.max()) if kl.numel() else 0.0, int(kl.numel()))


def record(kl_mean: float, kl_max: float, tokens: int) -> dict[str, Any]:
    return {"kl_mean": kl_mean, "kl_max": kl_max, "tokens": tokens, "unit": "nats per token",
            "direction": "KL(intact || edited)", "source": SOURCE}


def no_damage(ref: Reference | None = None) -> dict[str, Any]:
    """The record when nothing was edited (no heads): the edited model is the intact one."""
    return record(0.0, 0.0, int(ref.logprobs.shape[0]) if ref is not None else 0)


__all__ = ["Reference", "reference", "measure", "no_damage", "kl_per_position", "neutral_passages", "SOURCE",
           "MAX_TOKENS"]
