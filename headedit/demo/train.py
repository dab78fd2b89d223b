"""Train the demo model: a 2-layer Llama that learns two conflicting copy tasks from one shared prompt.

Why it shows CEL: copy-first (60%) and copy-second (40%) see the same prompt `<bos>A aa+bb=`, so the
joint optimum answers with the first number. The features that favour the first number end up in a few
layer-0 heads; zeroing them leaves the second number's features and the model answers copy-second.

Reproducible by seed: model init, batch order and task mixture all come from `seed`, training runs with
deterministic algorithms on 2 threads. `python -m headedit.demo.train OUT [--seed 0] [--steps 1500]`.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, cast

import torch

from headedit.demo.data import FIRST_SHARE, VOCAB, build_tokenizer, copy_target, index_pair, prompt_text, split_pairs
from headedit.errors import HeadeditError, OutputExistsError
from headedit.events import Log, Reporter, StageFinished, StageProgress, StageStarted, null_reporter

if TYPE_CHECKING:  # annotation only: transformers is imported lazily, inside the functions that use it
    from transformers import PreTrainedModel

SEQ_LEN = 13  # <bos> A ' ' a a + b b = 0 x x <eos>
ANSWER_FROM = 9  # first answer token's position; loss on positions 9..12 (answer + <eos>)


def demo_config(vocab_size: int = len(VOCAB)):
    """LlamaConfig of the demo: 2 layers x 4 heads, hidden 32 (head_dim 8), MLP 128, untied embeddings."""
    from transformers import LlamaConfig

    tok = {t: i for i, t in enumerate(VOCAB)}
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        max_position_embeddings=32,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=tok["<bos>"],
        eos_token_id=tok["<eos>"],
        pad_token_id=tok["<pad>"],
        architectures=["LlamaForCausalLM"],
    )


def encode_rows(tokenizer, texts: list[str]) -> torch.Tensor:
    """Token ids of full training sequences, all SEQ_LEN long."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    bad = [t for t, row in zip(texts, ids) if len(row) != SEQ_LEN]
    if bad:
        raise ValueError(f"sequence {bad[0]!r} is not {SEQ_LEN} tokens")
    return torch.tensor(ids, dtype=torch.long)  # [rows, pos]


def copy_sequences(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Training sequences of both copy tasks over the train pairs: ([pairs, pos] first, [pairs, pos] second)."""
    pairs = [index_pair(i) for i in split_pairs("train")]
    eos = tokenizer.eos_token
    first = encode_rows(tokenizer, [prompt_text(a, b) + copy_target("copy-first", a, b) + eos for a, b in pairs])
    second = encode_rows(tokenizer, [prompt_text(a, b) + copy_target("copy-second", a, b) + eos for a, b in pairs])
    return first, second


def lr_lambda(warmup: int, steps: int) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to zero."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def answer_loss(logits: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy on the answer tokens and <eos> only."""
    pred = logits[:, ANSWER_FROM - 1 : SEQ_LEN - 1, :]  # [batch, 4, vocab]: logits that predict positions 9..12
    gold = seqs[:, ANSWER_FROM:SEQ_LEN]  # [batch, 4]
    return torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), gold.reshape(-1))  # [batch*4, vocab]


def fit(
    model: torch.nn.Module,
    sample: Callable[[torch.Generator, int], tuple[torch.Tensor, torch.Tensor | None]],
    seed: int,
    steps: int,
    reporter: Reporter,
    stage: str,
    batch_size: int = 256,
    lr: float = 3e-3,
    warmup: int = 100,
) -> float:
    """The shared training loop; `sample` returns a batch [batch, pos] and an optional per-row head mask.

    Returns the mean answer loss over the last 100 steps.
    """
    # lazy: torch-backed, loaded only when a model is
    from headedit.model.ablation import ablate

    gen = torch.Generator().manual_seed(seed + 1)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, steps))
    reporter(StageStarted(stage, total=steps, description=f"training the demo model, seed {seed}"))
    recent: list[float] = []
    model.train()
    with ablate(model) as ablation:
        for step in range(steps):
            seqs, mask = sample(gen, batch_size)
            ablation.set_mask(mask)
            logits = model(input_ids=seqs[:, :-1]).logits  # [batch, pos-1, vocab]
            loss = answer_loss(logits, seqs)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            recent = (recent + [loss.item()])[-100:]
            if (step + 1) % 50 == 0 or step + 1 == steps:
                reporter(StageProgress(stage, done=step + 1, total=steps))
            if (step + 1) % 250 == 0:
                reporter(Log(f"{stage}: step {step + 1}/{steps}, answer loss {sum(recent) / len(recent):.4f}"))
    model.eval()
    final = sum(recent) / max(1, len(recent))
    reporter(StageFinished(stage, summary=f"answer loss {final:.4f} (mean of the last {len(recent)} steps)"))
    return final


class _Deterministic:
    """Deterministic algorithms on `threads` threads inside the block; the caller's settings come back after."""

    def __init__(self, threads: int = 2) -> None:
        self.threads = threads

    def __enter__(self) -> None:
        self._threads = torch.get_num_threads()
        self._det = torch.are_deterministic_algorithms_enabled()
        self._warn = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self._threads)
        torch.use_deterministic_algorithms(self._det, warn_only=self._warn)


def new_model(seed: int, vocab_size: int = len(VOCAB)) -> torch.nn.Module:
    """A freshly initialised demo model (std 0.02), float32, eager attention for reproducibility."""
    from transformers import GenerationConfig, LlamaForCausalLM

    config = demo_config(vocab_size)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
        max_new_tokens=4,
    )
    return model.float()


def check_output(out_dir: str | Path, force: bool) -> Path:
    """Refuse a non-empty output folder unless forced (checked before training, and again before writing)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise OutputExistsError(f"{out} already exists and is not empty", "pass force=True (--force) to replace it")
    return out


def save_checkpoint(model: torch.nn.Module, tokenizer, out_dir: str | Path, force: bool = False) -> Path:
    """Write config, generation config, tokenizer and model.safetensors into `out_dir`, atomically.

    Everything goes into a sibling temp folder first and is renamed into place, so a crash never
    leaves a half-written checkpoint; an existing folder is replaced only with `force`.
    """
    out = check_output(out_dir, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the library never prints; progress goes through the reporter
    try:
        cast("PreTrainedModel", model).save_pretrained(tmp)  # the demo model is a LlamaForCausalLM
        tokenizer.save_pretrained(tmp)
        leftovers = [p.name for p in tmp.iterdir() if p.suffix in (".bin", ".pt", ".pth")]
        if leftovers or not (tmp / "model.safetensors").is_file():
            raise RuntimeError(f"checkpoint must be safetensors only, found {leftovers or 'no model.safetensors'}")
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def train(
    out_dir: str | Path,
    seed: int = 0,
    steps: int = 1500,
    reporter: Reporter | None = None,
    force: bool = False,
    threads: int = 2,
) -> Path:
    """Train the copy-first/copy-second demo model and save it to `out_dir`; returns the folder.

    Same seed and same `threads` give bit-identical weights. Across thread counts the CPU kernels may split
    reductions differently (they did on one of our machines and not on another), so the last bits can differ;
    the demo's effect does not depend on them (tests/test_demo_model.py retrains with thresholds).
    """
    check_output(out_dir, force)
    report = reporter or null_reporter
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    with _Deterministic(threads):
        first, second = copy_sequences(tokenizer)  # [pairs, pos] each
        model = new_model(seed)

        def sample(gen: torch.Generator, n: int) -> tuple[torch.Tensor, None]:
            rows = torch.randint(0, first.shape[0], (n,), generator=gen)  # [batch]
            pick_first = (torch.rand(n, generator=gen) < FIRST_SHARE).unsqueeze(1)  # [batch, 1]
            return torch.where(pick_first, first[rows], second[rows]), None  # [batch, pos]

        fit(model, sample, seed, steps, report, stage="demo:train")
    path = save_checkpoint(model, tokenizer, out_dir, force=force)
    report(Log(f"demo model saved to {path} in {time.perf_counter() - started:.1f} s"))
    return path


def run_script(train_fn: Callable[..., Path], prog: str, description: str, steps: int, threads: int,
               argv: list[str] | None = None) -> int:
    """The command line of a demo training script: `OUT [--seed] [--steps] [--force] [--threads]`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--threads", type=int, default=threads)
    args = parser.parse_args(argv)

    def printer(event: object) -> None:
        if isinstance(event, Log):
            print(event.message)  # noqa: T201 (script)
        elif isinstance(event, StageFinished):
            print(f"{event.stage}: {event.summary}")  # noqa: T201 (script)

    try:
        train_fn(args.out_dir, seed=args.seed, steps=args.steps, reporter=printer, force=args.force,
                 threads=args.threads)
    except HeadeditError as err:
        print(f"error: {err}")  # noqa: T201 (script)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_script(train, "python -m headedit.demo.train", __doc__.splitlines()[0], 1500, 2, argv)


if __name__ == "__main__":
    raise SystemExit(main())
