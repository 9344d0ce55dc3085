"""`dsd_jax.stats`: paired intervals that resolve a 5% difference and do not invent one,
also where repeats of one prompt group are correlated (clusters). Synthetic data only (no
timing)."""

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
    assert text.startswith(f"{res['ratio']:.2f}x [") and text.endswith(f"]* +-{100 * stats.resolution(res):.1f}%")
    one = stats.paired_ratio([2.0], [1.0])
    assert one == {"ratio": 2.0, "lo": None, "hi": None, "n": 1, "pairs": 1, "ci": 0.95, "method": None}
    assert not stats.is_real(one) and stats.resolution(one) is None and not stats.resolves(one)
    assert stats.format_ratio(one) == "2.00x [n=1: no interval]" and stats.format_ratio(None) == "-"
    # constant ratio: a zero-width interval
    same = stats.paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert same["lo"] == pytest.approx(2.0) and same["hi"] == pytest.approx(2.0)


def _grouped(groups, repeats, true_ratio, between, within, seed):
    """The bench's layout, pairs[rep * G + g]: each prompt group shifts every one of its
    repeats' log-ratios by its own amount (acceptance), each repeat adds machine noise."""
    rng = np.random.default_rng(seed)
    logs = math.log(true_ratio) + rng.normal(0, between, groups)[None, :] + rng.normal(0, within, (repeats, groups))
    b = 100.0 * rng.lognormal(0.0, 0.2, logs.size)
    return b * np.exp(logs.ravel()), b, [i % groups for i in range(logs.size)]


def test_cluster_interval_covers_a_known_ratio_where_repeats_are_correlated():
    """8 prompt groups x 6 repeats, group spread 0.073 and repeat noise 0.034 in log-ratio
    (the B=1 bench's, s17): resampling pairs as independent covers the true 1.05 in 178 of
    300 datasets; resampling groups in 285."""
    iid = grouped = 0
    for seed in range(300):
        a, b, groups = _grouped(8, 6, 1.05, 0.073, 0.034, seed)
        pairs = stats.paired_ratio(a, b, n_boot=300, seed=seed)
        iid += pairs["lo"] <= 1.05 <= pairs["hi"]
        res = stats.paired_ratio(a, b, n_boot=300, seed=seed, clusters=groups)
        assert res["n"] == 8 and res["pairs"] == 48 and res["method"] == "bootstrap"
        grouped += res["lo"] <= 1.05 <= res["hi"]
    assert iid < 0.75 * 300, iid  # the defect the clusters fix
    assert grouped >= 0.92 * 300, grouped


def test_clusters_count_groups_and_few_groups_get_a_t_interval():
    a, b, groups = _grouped(4, 6, 1.1, 0.05, 0.02, seed=1)
    res = stats.paired_ratio(a, b, clusters=groups)
    logs = (np.log(a) - np.log(b)).reshape(6, 4)  # repeat x group
    assert res["n"] == 4 and res["pairs"] == 24 and res["method"] == "t"
    assert res["ratio"] == pytest.approx(math.exp(logs.mean()))  # geometric mean over every pair
    half = stats.t_quantile(0.975, 3) * logs.mean(axis=0).std(ddof=1) / 2  # t_3 * s / sqrt(4) on group means
    assert math.log(res["hi"]) == pytest.approx(logs.mean() + half)
    assert math.log(res["lo"]) == pytest.approx(logs.mean() - half)
    # the labels, not their order, make the units; one group has no interval
    same = stats.paired_ratio(a, b, clusters=[f"g{x}" for x in groups])
    assert same == res
    one = stats.paired_ratio(a, b, clusters=[0] * 24)
    assert one["n"] == 1 and one["lo"] is None and one["method"] is None
    assert stats.format_ratio(one).endswith("[n=1: no interval]")
    assert stats.ratios_to({"x": a, "y": b}, "y", clusters=groups)["x"] == res
    with pytest.raises(ValueError, match="one label per pair"):
        stats.paired_ratio(a, b, clusters=groups[:-1])


def test_any_hashable_cluster_label_is_a_unit():
    """Tuples (a (repeat, group) key) and None are labels like any other: the same units as
    integer labels give the same interval, here a bootstrap, where the units' order matters."""
    a, b, groups = _grouped(8, 3, 1.1, 0.05, 0.02, seed=2)
    res = stats.paired_ratio(a, b, clusters=groups)
    assert res["n"] == 8 and res["method"] == "bootstrap"
    assert stats.paired_ratio(a, b, clusters=[(x, "group") for x in groups]) == res
    assert stats.paired_ratio(a, b, clusters=[None if x == 0 else x for x in groups]) == res
    with pytest.raises(ValueError, match="hashable labels"):
        stats.paired_ratio(a, b, clusters=[[x] for x in groups])


def test_two_to_four_units_get_a_t_interval():
    """A bootstrap of 2 units is [min, max] stretched (93% coverage); t is exact for normal
    log-ratios: 2000 seeded datasets of 2 pairs cover the true ratio about 95% of the time."""
    res = stats.paired_ratio([2.0, 2.4], [1.0, 1.0])
    d = math.log(2.4) - math.log(2.0)
    assert res["method"] == "t" and res["n"] == 2
    assert math.log(res["hi"] / res["lo"]) == pytest.approx(2 * stats.t_quantile(0.975, 1) * abs(d) / 2)
    rng = np.random.default_rng(0)
    covered = 0
    for seed in range(2000):
        b = rng.lognormal(5.0, 0.2, 2)
        r = stats.paired_ratio(b * 1.05 * rng.lognormal(0.0, 0.03, 2), b, seed=seed)
        covered += r["lo"] <= 1.05 <= r["hi"]
    assert covered >= 0.935 * 2000, covered
    assert stats.paired_ratio(*_pairs(5, 1.0, 0.05, seed=0))["method"] == "bootstrap"


def test_resolves_five_percent():
    assert stats.resolves({"ratio": 1.0, "lo": 0.96, "hi": 1.04})
    assert not stats.resolves({"ratio": 1.0, "lo": 0.9, "hi": 1.1})
    assert not stats.resolves({"ratio": 1.0, "lo": None, "hi": None}) and not stats.resolves(None)


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
