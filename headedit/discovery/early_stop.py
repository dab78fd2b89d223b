"""Sequential early stop for the single-head screen: stop spending examples on heads clearly worse than intact.

Rule (stated verbatim in screen.json): after `chunk`, 2*`chunk`, 4*`chunk`, ... examples, with at least
`min_n` examples seen, a head is dropped when the one-sided exact sign test on its per-example changes
against the intact model (examples where the objective fell vs rose: on accuracy, the discordant pairs
broken vs fixed) gives p < `alpha`. The sign test needs no distribution assumption, so the same rule serves
0/1 outcomes and the continuous objectives.
`alpha` is per look; with the default 1e-4 and at most a few dozen looks the chance of dropping a
head that is not worse stays below ~1e-3 per head. Dropped heads keep the paired accuracy change
measured on the examples they saw, and rank after every head that saw the whole split when the
search picks candidates, so a clearly harmful head never displaces a completed one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headedit.stats import sign_test_worse


@dataclass(frozen=True)
class EarlyStop:
    chunk: int = 64  # examples per look
    alpha: float = 1e-4  # one-sided sign-test level per look
    min_n: int = 64  # no decision before this many examples

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.min_n < 1 or not 0.0 < self.alpha < 1.0:
            raise ValueError("early stop needs chunk >= 1, min_n >= 1 and 0 < alpha < 1")

    def rule(self) -> str:
        return (
            f"after {self.chunk}, {2 * self.chunk}, {4 * self.chunk}, ... discovery examples (doubling; from "
            f"{self.min_n} on), drop a head when the "
            f"one-sided exact sign test on its per-example changes vs intact (examples worse vs better; on "
            f"accuracy the discordant pairs broken vs fixed) gives p < {self.alpha:g}; "
            "dropped heads keep the paired change on the examples they saw and rank after every completed head"
        )

    def should_drop(self, intact: np.ndarray, ablated: np.ndarray) -> bool:
        """Intact and ablated per-example outcomes (bits or objective values; intact may be longer); True when
        the head is clearly worse on the examples the ablated set saw."""
        if ablated.size < self.min_n:
            return False
        change = np.asarray(ablated, dtype=np.float64) - np.asarray(intact[: ablated.size], dtype=np.float64)
        better, worse = int(np.count_nonzero(change > 0)), int(np.count_nonzero(change < 0))
        return worse > better and sign_test_worse(better, worse) < self.alpha

    def boundaries(self, n: int) -> list[int]:
        """Example counts after which the rule is applied: chunk, 2*chunk, 4*chunk, ... then n.

        Doubling keeps the number of looks (and engine calls) logarithmic in n while a clearly
        harmful head still stops after the first chunk.
        """
        marks, k = [], self.chunk
        while k < n:
            marks.append(k)
            k *= 2
        return marks + [n]

    def to_dict(self) -> dict:
        return {"chunk": self.chunk, "alpha": self.alpha, "min_n": self.min_n}
