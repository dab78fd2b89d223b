"""Paired statistics checked against scipy and against brute-force definitions."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from headedit import stats


def _pairs(fixed: int, broken: int, both_right: int, both_wrong: int) -> tuple[np.ndarray, np.ndarray]:
    intact = [False] * fixed + [True] * broken + [True] * both_right + [False] * both_wrong
    edited = [True] * fixed + [False] * broken + [True] * both_right + [False] * both_wrong
    return np.array(intact), np.array(edited)


@pytest.mark.parametrize("fixed,broken", [(0, 0), (3, 1), (10, 2), (7, 7), (0, 25), (40, 13)])
def test_mcnemar_matches_scipy_binomtest(fixed: int, broken: int) -> None:
    a, b = _pairs(fixed, broken, 30, 20)
    p = stats.mcnemar_exact(a, b)
    if fixed + broken == 0:
        assert p == 1.0
    else:
        ref = sps.binomtest(fixed, fixed + broken, 0.5, alternative="two-sided").pvalue
        assert p == pytest.approx(min(1.0, ref), rel=1e-9)


def test_mcnemar_tiny_p_is_floored_not_zero() -> None:
    a, b = _pairs(2000, 0, 0, 0)
    p = stats.mcnemar_exact(a, b)
    assert p == stats.P_FLOOR
    assert stats.format_p(p) == "p < 1e-300"
    # a p just above the floor keeps its value (log-space tail)
    a, b = _pairs(900, 0, 0, 0)
    assert stats.mcnemar_exact(a, b) == pytest.approx(2 * 0.5**900, rel=1e-9)


def test_sign_test_worse_one_sided() -> None:
    assert stats.sign_test_worse(2, 10) == pytest.approx(sps.binomtest(10, 12, 0.5, alternative="greater").pvalue)
    assert stats.sign_test_worse(0, 0) == 1.0


def test_bootstrap_matches_index_resampling() -> None:
    rng = np.random.default_rng(1)
    a = rng.random(300) < 0.6
    b = np.where(rng.random(300) < 0.2, ~a, a)
    lo, hi = stats.paired_bootstrap_ci(a, b, n_boot=20_000)
    # brute force: resample example indices
    idx = rng.integers(0, 300, size=(20_000, 300))
    gains = 100 * (b[idx].mean(1) - a[idx].mean(1))
    ref_lo, ref_hi = np.quantile(gains, [0.025, 0.975])
    assert lo == pytest.approx(ref_lo, abs=0.5)
    assert hi == pytest.approx(ref_hi, abs=0.5)
    g = stats.gain_points(a, b)
    assert lo < g < hi


def test_bootstrap_degenerate_and_deterministic() -> None:
    a, b = _pairs(0, 0, 10, 5)
    assert stats.paired_bootstrap_ci(a, b) == (0.0, 0.0)
    a, b = _pairs(5, 2, 10, 5)
    assert stats.paired_bootstrap_ci(a, b, seed=3) == stats.paired_bootstrap_ci(a, b, seed=3)


def test_wilson_against_statsmodels_formula() -> None:
    lo, hi = stats.wilson_interval(8, 10)
    assert lo == pytest.approx(0.4901625, abs=1e-6)
    assert hi == pytest.approx(0.9433178, abs=1e-6)
    assert stats.wilson_interval(0, 10)[0] == 0.0
    assert stats.wilson_interval(10, 10)[1] == pytest.approx(1.0)


def test_relative_error_reduction_and_summary() -> None:
    assert stats.relative_error_reduction(0.704, 0.835) == pytest.approx(0.13100 / 0.296)
    assert stats.relative_error_reduction(1.0, 1.0) is None
    a, b = _pairs(12, 2, 50, 36)
    s = stats.paired_summary(a, b)
    assert s["n"] == 100
    assert s["intact_acc"] == pytest.approx(0.52)
    assert s["edited_acc"] == pytest.approx(0.62)
    assert s["gain_points"] == pytest.approx(10.0)
    assert s["ci95_points"][0] < 10.0 < s["ci95_points"][1]
    assert s["mcnemar_p"] == pytest.approx(sps.binomtest(12, 14, 0.5).pvalue)


def test_unequal_lengths_rejected() -> None:
    with pytest.raises(ValueError):
        stats.mcnemar_exact([True], [True, False])
