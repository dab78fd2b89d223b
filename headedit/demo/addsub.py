"""Train the add/sub demo: a 2-layer Llama whose harmful heads for subtraction are known, because we plant them.

Why it has a ground truth: addition (`<bos>A aa+bb=`) and subtraction (`<bos>S aa-bb=`) train together, and on
subtraction rows the planted heads are zeroed (o_proj input columns, the same cut headedit makes). Subtraction is
therefore learned by a circuit without them, while they keep learning addition only; at inference their addition
features disturb subtraction, and zeroing them improves it (at addition's expense). See `PLANTING`:

- a single head, `1.2`, harmful alone;
- a pair, `0.1` + `1.0`: zeroing `0.1` alone helps, zeroing `1.0` alone does not (it looks harmless or slightly
  useful), zeroing both helps most. Only a search whose first additions draw from every head finds `1.0`;
- an idle head, `0.3`, zeroed on every row: a stand-in for the near-silent heads of real models, which fill the
  screen's candidate list ahead of the pair's hidden half.

A planted head is not zeroed on every subtraction row: on the rest it stays on with its attention output detached
(its query/key/value weights learn nothing from subtraction), so the subtraction circuit partly learns to live with
it. That sets how much each head disturbs: zeroed on every row, each planted head alone broke subtraction completely
and no single ablation showed anything (measured while tuning, headedit/demo/README.md).

Reproducible by seed and thread count (deterministic algorithms). `python -m headedit.demo.addsub OUT [--seed 0]`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from headedit.demo.addsub_data import (
    ADDSUB_VOCAB,
    IDLE_HEADS,
    PAIR_HIDDEN,
    PAIR_VISIBLE,
    PLANTED_SINGLE,
    AddSubTask,
    build_tokenizer,
    prompt_text,
    target_text,
)
from headedit.demo.data import index_pair, split_pairs
from headedit.demo.train import _Deterministic, check_output, encode_rows, fit, new_model, run_script, save_checkpoint
from headedit.events import Log, Reporter, null_reporter
from headedit.model.ablation import heads_to_mask
from headedit.model.heads import Head, HeadLayout

SUB_SHARE = 0.6  # share of subtraction rows: it is the harder task, and planted heads make it harder still
STEPS = 1500
# Independent factors, drawn per subtraction row: (the factor's heads, [(heads zeroed, probability), ...]).
# A factor's heads that are not zeroed on a row stay on with their attention output detached.
PLANTING: tuple[tuple[tuple[Head, ...], tuple[tuple[tuple[Head, ...], float], ...]], ...] = (
    (PLANTED_SINGLE, ((PLANTED_SINGLE, 0.95),)),
    # The pair is zeroed together on most rows and its visible half alone on some; its hidden half is never zeroed
    # alone, so zeroing only it at inference is a state subtraction never trained in.
    ((PAIR_VISIBLE, PAIR_HIDDEN), (((PAIR_VISIBLE, PAIR_HIDDEN), 0.80), ((PAIR_VISIBLE,), 0.12))),
)


def task_rows(tokenizer: Any, task: AddSubTask, split: str = "train") -> torch.Tensor:
    """Full sequences (prompt, three answer characters, `<eos>`) of one task over one pair split: [pairs, pos]."""
    pairs = [index_pair(i) for i in split_pairs(split)]  # type: ignore[arg-type]
    eos = tokenizer.eos_token
    return encode_rows(tokenizer, [prompt_text(task, a, b) + target_text(task, a, b) + eos for a, b in pairs])


class StopGradient:
    """Per-row stop-gradient on chosen heads' o_proj input: the head still writes, its q/k/v learn nothing from it.

    Registered before `fit`'s ablation hooks, so on a row where a head is also zeroed the zero wins.
    """

    def __init__(self, model: torch.nn.Module, layout: HeadLayout) -> None:
        self.layout = layout
        self.mask: torch.Tensor | None = None  # [batch, layers, heads] bool, True = detached
        self._handles = [
            model.get_submodule(layout.o_proj_path(layer)).register_forward_pre_hook(self._hook(layer))
            for layer in range(layout.num_layers)
        ]

    def _hook(self, layer: int):
        def pre_hook(module: torch.nn.Module, args: tuple) -> tuple | None:
            if self.mask is None or not bool(self.mask[:, layer].any()):
                return None
            x = args[0]  # [batch, pos, head * d_head]
            cols = self.layout.column_mask(self.mask[:, layer, :]).unsqueeze(1)  # [batch, 1, head * d_head]
            return (torch.where(cols, x.detach(), x),) + tuple(args[1:])

        return pre_hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.mask = None


def planting_masks(gen: torch.Generator, is_sub: torch.Tensor, layout: HeadLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(zeroed, detached) per row, each [batch, layers, heads] bool.

    `PLANTING` applies to subtraction rows only (addition must keep training the planted heads); idle heads are
    zeroed on every row.
    """
    n = int(is_sub.shape[0])
    zeroed = torch.zeros(n, layout.num_layers, layout.num_heads, dtype=torch.bool)  # [batch, layer, head]
    detached = torch.zeros_like(zeroed)  # [batch, layer, head]
    for heads, options in PLANTING:
        factor = heads_to_mask(layout, [heads])[0]  # [layer, head]
        choices = heads_to_mask(layout, [zeroed_heads for zeroed_heads, _ in options])  # [option, layer, head]
        bounds = torch.tensor([p for _, p in options]).cumsum(0)  # [option]
        which = torch.searchsorted(bounds, torch.rand(n, generator=gen), right=True)  # [batch]; == options: none
        row_zero = torch.zeros_like(zeroed)  # [batch, layer, head]
        picked = which < len(options)  # [batch]
        row_zero[picked] = choices[which[picked]]
        zeroed |= row_zero
        detached |= factor.unsqueeze(0) & ~row_zero
    on_sub = is_sub.view(n, 1, 1)  # [batch, 1, 1]
    zeroed &= on_sub
    detached &= on_sub
    zeroed |= heads_to_mask(layout, [IDLE_HEADS])  # [1, layer, head] broadcast: idle on every row
    return zeroed, detached


def train(
    out_dir: str | Path,
    seed: int = 0,
    steps: int = STEPS,
    reporter: Reporter | None = None,
    force: bool = False,
    threads: int = 1,
) -> Path:
    """Train the add/sub demo model with the planted heads and save it to `out_dir`; returns the folder.

    One thread by default: on the 2-core machine it trained on, two threads were barely faster, and a fixed thread
    count keeps the weights bit-identical between runs (the planted effect is tuned, so it is worth pinning).
    """
    check_output(out_dir, force)
    report = reporter or null_reporter
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    with _Deterministic(threads):
        add_rows = task_rows(tokenizer, "add-demo")  # [pairs, pos]
        sub_rows = task_rows(tokenizer, "sub-demo")  # [pairs, pos]
        model = new_model(seed, len(ADDSUB_VOCAB))
        layout = HeadLayout.from_model(model)
        stop_grad = StopGradient(model, layout)

        def sample(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
            rows = torch.randint(0, add_rows.shape[0], (n,), generator=gen)  # [batch]
            is_sub = torch.rand(n, generator=gen) < SUB_SHARE  # [batch]
            zeroed, stop_grad.mask = planting_masks(gen, is_sub, layout)
            return torch.where(is_sub.unsqueeze(1), sub_rows[rows], add_rows[rows]), zeroed  # [batch, pos]

        try:
            fit(model, sample, seed, steps, report, stage="addsub:train")
        finally:
            stop_grad.remove()
    path = save_checkpoint(model, tokenizer, out_dir, force=force)
    report(Log(f"add/sub demo model saved to {path} in {time.perf_counter() - started:.1f} s"))
    return path


def main(argv: list[str] | None = None) -> int:
    return run_script(train, "python -m headedit.demo.addsub", __doc__.splitlines()[0], STEPS, 1, argv)


if __name__ == "__main__":
    raise SystemExit(main())
