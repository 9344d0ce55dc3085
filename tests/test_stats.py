"""`dsd_jax.stats`: paired bootstrap intervals that resolve a 5% difference and do not
invent one. Synthetic data only (no timing)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsd_jax import stats


def _pairs(n, true_ratio, noise, seed):
    """Paired runs: a shared per-pair machine state (drift, 20%) times each run's own noise."""
    rng = np.random.default_rng(seed)
    drift = rng.lognormal(0.0, 0.2, n)
    b = 100.0 * drift * rng.lognormal(0.0, noise, n)
    a = true_ratio * 100.0 * drift * rng.lognormal(0.0, noise, n)
    return a, b


def test_five_percent_with_three_percent_noise_is_resolved():
    a, b = _pairs(30, 1.05, 0.03, seed=0)
    res = stats.paired_ratio(a, b)
    assert res["n"] == 30 and res["ci"] == 0.95
    assert 1.0 < res["lo"] < res["ratio"] < res["hi"]
    assert res["lo"] <= 1.05 <= res["hi"]
    assert stats.is_real(res) and stats.verdict(res) == "higher"
    assert stats.resolution(res) < 0.03  # finer than the effect
    # the drift shared by a pair cancels: unpaired, the same data resolve nothing
    shuffled = stats.paired_ratio(a, np.random.default_rng(1).permutation(b))
    assert not stats.is_real(shuffled)
    # reversed arguments give the reciprocal
    rev = stats.paired_ratio(b, a)
    assert rev["ratio"] == pytest.approx(1 / res["ratio"])
    assert stats.verdict(rev) == "lower"


def test_identical_distributions_contain_one():
    a, b = _pairs(30, 1.0, 0.03, seed=3)
    res = stats.paired_ratio(a, b)
    assert res["lo"] < 1.0 < res["hi"] and not stats.is_real(res)
    assert stats.verdict(res) == "unresolved"
    # calibration: over many seeded datasets the 95% interval contains 1 about 95% of
    # the time, also with few pairs (the small-sample widening)
    for n in (4, 12):
        covered = sum(not stats.is_real(stats.paired_ratio(*_pairs(n, 1.0, 0.05, seed=s), n_boot=500, seed=s))
                      for s in range(200))
        assert covered >= 0.9 * 200, (n, covered)


def test_deterministic_and_formatting():
    a, b = _pairs(8, 1.2, 0.05, seed=2)
    assert stats.paired_ratio(a, b, seed=7) == stats.paired_ratio(a, b, seed=7)
    res = stats.paired_ratio(a, b)
    text = stats.format_ratio(res)
    assert text.startswith(f"{res['ratio']:.2f}x [") and text.endswith("]*")
    one = stats.paired_ratio([2.0], [1.0])
    assert one == {"ratio": 2.0, "lo": None, "hi": None, "n": 1, "ci": 0.95}
    assert not stats.is_real(one) and stats.resolution(one) is None
    assert stats.format_ratio(one) == "2.00x [n=1]" and stats.format_ratio(None) == "-"
    # constant ratio: a zero-width interval
    same = stats.paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert same["lo"] == pytest.approx(2.0) and same["hi"] == pytest.approx(2.0)


def test_t_quantile_matches_tables():
    for df, ref in [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)]:
        assert stats.t_quantile(0.975, df) == pytest.approx(ref, rel=5e-3)
    with pytest.raises(ValueError):
        stats.t_quantile(0.4, 3)


@pytest.mark.parametrize("a, b, match", [
    ([], [], "empty"),
    ([1.0, 2.0], [1.0], "equal length"),
    ([1.0, 0.0], [1.0, 1.0], "positive"),
    ([1.0, -2.0], [1.0, 1.0], "positive"),
    ([1.0, math.nan], [1.0, 1.0], "finite"),
    (["x"], [1.0], "numbers"),
])
def test_degenerate_input_raises(a, b, match):
    with pytest.raises(ValueError, match=match):
        stats.paired_ratio(a, b)


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="ci"):
        stats.paired_ratio([1.0, 2.0], [1.0, 2.0], ci=1.5)
    with pytest.raises(ValueError, match="n_boot"):
        stats.paired_ratio([1.0, 2.0], [1.0, 2.0], n_boot=10)
