"""The discovery objective: what the screens, the search and the early stop rank and test head sets by.

Every evaluation yields, per example, the correctness bit (the paper's metric, what validation reports) and a
continuous value from the same forward pass (`headedit.engine.scores`):

- `accuracy`: the bit itself (0/1); effects are reported in points.
- `margin`: how far the example is from flipping. Choice tasks: the correct choice's score minus the best wrong
  choice's (scores as the task compares them: summed log-probabilities, per byte for acc_norm). Exact tasks: the
  smallest, over the answer tokens, of the target token's log-probability minus the best other token's. Positive
  exactly when the example is right (up to ties), so it is the continuous version of the bit.
- `logprob`: choice tasks: the log of the correct choice's probability among the choices (softmax of the scores);
  exact tasks: the answer's summed log-probability.

Generated tasks (pass@1, unit tests) have no such quantity: every objective falls back to accuracy there.
Paired tests on a continuous value see effects that a 0/1 outcome hides at small n (docs/discovery.md).
"""
from __future__ import annotations

import math

import numpy as np

from headedit.recipe import OBJECTIVES  # the recipe validates the name; the meaning lives here
from headedit.stats import paired_t_greater


def effective(objective: str, task_kind: str) -> str:
    """The objective a task can provide: generated tasks fall back to accuracy."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}")
    return "accuracy" if task_kind == "generate" else objective


def scale(objective: str) -> float:
    """Factor from a mean difference of per-example values to the reported unit (accuracy: points)."""
    return 100.0 if objective == "accuracy" else 1.0


def unit(objective: str) -> str:
    return {"accuracy": "points", "margin": "nats of margin", "logprob": "nats of log-probability"}[objective]


def describe(objective: str) -> str:
    return {
        "accuracy": "discovery accuracy (0/1 per example)",
        "margin": "per-example margin (correct answer's score minus the best wrong one's)",
        "logprob": "per-example log-probability of the correct answer",
    }[objective]




def summary(objective: str, intact: np.ndarray, edited: np.ndarray, level: float = 0.95) -> dict[str, object]:
    """Validation's report of the objective on held-out: means, paired gain with a t interval, one-sided p."""
    # scipy comes with scikit-learn; imported here to keep CLI start-up light
    from scipy.special import stdtrit

    a, b = np.asarray(intact, np.float64), np.asarray(edited, np.float64)
    d = (b - a) * scale(objective)  # [n] per-example gain in the objective's unit
    n = int(d.size)
    half = float(stdtrit(n - 1, 0.5 + level / 2) * d.std(ddof=1) / math.sqrt(n)) if n > 1 else float("inf")
    gain = float(d.mean()) if n else 0.0
    return {"name": objective, "unit": unit(objective), "n": n, "intact": float(a.mean()) if n else 0.0,
            "edited": float(b.mean()) if n else 0.0, "gain": gain, "ci": [gain - half, gain + half],
            "level": level, "p_one_sided": paired_t_greater(d)}


__all__ = ["OBJECTIVES", "describe", "effective", "scale", "summary", "unit"]
