"""Latency learning: per-(bucket, K) factors on the profile's ITL, and the controller using them."""

import math

import numpy as np
import pytest

from dsd_jax.controller import Controller
from dsd_jax.latency import MAX_LOG_RATIO, PRIOR_STEPS, LatencyCorrection, LatencyModel

from test_controller import brute_goodput, goodput_spec, realistic_profile


def test_a_cell_never_run_takes_its_buckets_factor():
    lc = LatencyCorrection([1, 8], num_k=4, forgetting=0.05)
    assert np.all(lc.factors(8) == 1.0) and lc.observed() == {}
    for _ in range(30):
        lc.observe(8, 2, measured_ms=15.0, profile_ms=10.0)
    # one K observed: every K of the bucket scales alike, so no choice within it changes
    np.testing.assert_allclose(lc.factors(8), 1.5, rtol=1e-12)
    # other buckets (and unknown ones) take the mean over all cells
    np.testing.assert_allclose(lc.factors(1), 1.5, rtol=1e-12)
    np.testing.assert_allclose(lc.factors(64), 1.5, rtol=1e-12)
    assert list(lc.observed()) == [8] and lc.weights(8)[2] == pytest.approx((1 - 0.95 ** 30) / 0.05)
    assert lc.weights(8)[1] == 0.0 and lc.weights(3) == [0.0] * 4


def test_cells_separate_by_their_evidence_shrunk_toward_the_bucket():
    lc = LatencyCorrection([16], num_k=4, forgetting=0.05)
    for _ in range(200):
        lc.observe(16, 0, 8.0, 10.0)  # the profile timed K = 0 20% slow
        lc.observe(16, 3, 12.0, 10.0)  # and K = 3 20% fast
    f = lc.factors(16)
    w = (1 - 0.95 ** 200) / 0.05  # discounted weight of each cell
    bucket = (math.log(0.8) + math.log(1.2)) / 2
    expect = lambda x: math.exp((w * x + PRIOR_STEPS * bucket) / (w + PRIOR_STEPS))
    assert f[0] == pytest.approx(expect(math.log(0.8)), rel=1e-6)
    assert f[3] == pytest.approx(expect(math.log(1.2)), rel=1e-6)
    assert f[1] == f[2] == pytest.approx(math.exp(bucket))
    assert f[0] < f[1] < f[3]


def test_one_outlier_is_clipped_and_forgotten():
    lc = LatencyCorrection([4], num_k=2, forgetting=0.1)
    lc.observe(4, 1, 100.0, 10.0)  # a 10x stall (GC, another process)
    assert lc.factors(4)[1] == pytest.approx(math.exp(MAX_LOG_RATIO))
    for _ in range(100):
        lc.observe(4, 1, 10.0, 10.0)
    assert lc.factors(4)[1] == pytest.approx(1.0, abs=1e-3)
    for _ in range(100):  # the machine slows down for good: tracked
        lc.observe(4, 1, 13.0, 10.0)
    assert lc.factors(4)[1] == pytest.approx(1.3, rel=1e-3)


def test_unusable_observations_are_ignored():
    lc = LatencyCorrection([1, 2], num_k=2, forgetting=0.1)
    for args in [(3, 0, 5.0, 4.0), (1, 2, 5.0, 4.0), (1, -1, 5.0, 4.0), (1, 0, 0.0, 4.0), (1, 0, 5.0, 0.0),
                 (1, 0, float("nan"), 4.0)]:
        lc.observe(*args)
    assert lc.observations == 0 and np.all(lc.factors(1) == 1.0)


# ---------------------------------------------------------------- in the controller


def _run(c, b, true_ms, acceptance, steps, rng):
    """Drives the controller at batch size b on a machine whose step time is
    true_ms(k) (with 10% noise) and whose drafts are accepted with P(n >= i) = a_i."""
    ks = []
    for _ in range(steps):
        k = c.choose_k(b)
        accepted = (rng.random((b, 1)) < np.asarray(acceptance)[None, :k]).sum(1) if k else np.zeros(b, int)
        c.observe(k, accepted, step_time_s=true_ms(k) * math.exp(rng.normal(0, 0.1)) / 1e3)
        ks.append(k)
    return ks


def test_a_profile_cell_timed_wrong_stops_steering_the_choice():
    p = realistic_profile()
    acc = np.array(p.acceptance)
    g = brute_goodput(p, acc, 8, None, 6)
    assert int(np.argmax(g)) == 2  # the profile says K = 2 at B = 8 ...
    slow = {2: 1.25}  # ... but K = 2 steps really take 25% longer than it says
    true_g = g / np.array([slow.get(k, 1.0) for k in range(7)])
    best = int(np.argmax(true_g))
    assert best != 2 and g[best] >= 0.7 * g[2]  # a contender within explore_gap
    true_ms = lambda k: p.itl_ms(8, k) * slow.get(k, 1.0)

    learning = Controller(goodput_spec(warmup_steps=0, margin=0.03, latency_forgetting=0.02, explore_gap=0.3), p,
                          max_batch_size=64)
    ks = _run(learning, 8, true_ms, acc, 1500, np.random.default_rng(0))
    tail = ks[-300:]
    assert tail.count(2) / len(tail) < 0.1
    # the held Ks are (near-)best by the truth: K = 1 and K = 3 are within 2% of each other
    assert np.mean([true_g[k] for k in tail]) >= 0.97 * true_g[best]
    f = learning.stats()["latency_factors"][8]
    assert f[2] > 1.08 and f[2] > max(f[1], f[3]) + 0.05

    trusting = Controller(goodput_spec(warmup_steps=0, margin=0.03, latency_forgetting=0.0), p, max_batch_size=64)
    ks = _run(trusting, 8, true_ms, acc, 1500, np.random.default_rng(0))
    assert ks[-300:].count(2) / 300 > 0.9 and trusting.stats()["latency_factors"] == {}



def test_model_reads_the_profile_at_the_batch_bucket_and_context_bucket():
    p = realistic_profile(ctx=[0, 1000])
    lm = LatencyModel(p, max_batch_size=16, num_k=4, batch_buckets=[1, 4, 16], context_subdivisions=4)
    assert [lm.bucket(b) for b in (1, 2, 4, 5, 16, 40)] == [1, 4, 4, 16, 16, 40]
    assert [lm.context_key(c) for c in (-5, 0, 120, 130, 999, 5000)] == [0, 0, 0, 1, 4, 4]
    assert lm.cached_context_key(130) == 1 and lm.context_value(1) == 250.0
    rows = lm.itl_rows(1)
    assert rows.shape == (17, 4)
    np.testing.assert_array_equal(rows[2], [p.itl_ms(4, k, 250.0) for k in range(4)])
    np.testing.assert_array_equal(lm.itl(40, 0), [p.itl_ms(40, k) for k in range(4)])
    assert lm.predict_ms(2, 3, 130) == (p.itl_ms(4, 3, 130), p.itl_ms(4, 3, 130))
    assert lm.predict_ms(2, 7, None) is None  # the profile has no such K
    assert lm.correction is None and not lm.learn(2, 1, 5.0, 4.0) and lm.observed() == {}
    with pytest.raises(ValueError, match="NaN"):
        lm.context_key(float("nan"))


def test_serving_buckets_take_a_larger_bucket_only_where_it_is_faster_everywhere():
    from dsd_jax.buckets import serving_buckets
    # [context, batch, K] over buckets 1, 2, 4, 8: one row (an H200's M = 1 matmuls) is
    # slower than two at every K and context (by 12-30%); four rows beat one except at K = 2
    t = np.array([[[6.9, 6.8, 8.4], [5.3, 6.0, 7.5], [5.2, 6.4, 8.6], [5.9, 7.0, 9.0]],
                  [[7.1, 7.0, 8.6], [5.5, 6.2, 7.7], [5.4, 6.6, 8.8], [6.1, 7.2, 9.2]]])
    assert serving_buckets(t, [1, 2, 4, 8]) == {1: 2}
    assert serving_buckets(t, [1, 2, 4, 8], candidates=[1, 4, 8]) == {}  # 4 loses at K = 2
    assert serving_buckets(t, [1, 2, 4, 8], margin=0.1) == {1: 2}
    assert serving_buckets(t, [1, 2, 4, 8], margin=0.12) == {}  # 8.4 / 7.5 = 1.12
    t[:, 2] = t[:, 1] - 0.2                # now four rows beat one and two everywhere
    assert serving_buckets(t, [1, 2, 4, 8]) == {1: 4, 2: 4}  # 1: the cheaper of 2 and 4
    t[1, 1, 2] = 8.7                       # two rows slower than one at one cell
    assert serving_buckets(t, [1, 2, 4, 8]) == {1: 4, 2: 4}
    assert serving_buckets(t, [1, 2, 4, 8], candidates=[1, 2, 8]) == {}


def test_model_and_controller_serve_a_batch_in_the_bucket_its_profile_finds_faster():
    """One live row priced and dispatched at the two-row bucket when the profile times it
    faster there at every cell; the engine runs the bucket `serving_bucket` names."""
    from dsd_jax.profile import Profile
    table = [[6.9, 6.8, 8.4], [5.3, 6.0, 7.5], [5.6, 6.9, 8.6], [6.1, 7.2, 9.0]]
    p = Profile("cpu", [1, 2, 4, 8], [0, 1, 2], table, [0.7, 0.4])
    lm = LatencyModel(p, max_batch_size=8, num_k=3, batch_buckets=[1, 2, 4, 8], context_subdivisions=4)
    assert lm.serving == {1: 2} and [lm.bucket(b) for b in (1, 2, 3, 5)] == [2, 2, 4, 8]
    np.testing.assert_array_equal(lm.itl(1, 0), table[1])
    ctl = Controller(goodput_spec(max_k=2, warmup_steps=0), p, max_batch_size=8, batch_buckets=[1, 2, 4, 8])
    assert [ctl.serving_bucket(b) for b in (1, 2, 3, 8)] == [2, 2, 4, 8]
    np.testing.assert_allclose(ctl.predicted_goodput(1), ctl.predicted_goodput(2))
    # without that bucket compiled, or without the engine's buckets, the smallest that holds it
    assert Controller(goodput_spec(max_k=2), p, max_batch_size=8, batch_buckets=[1, 4, 8]).serving_bucket(1) == 1
    assert Controller(goodput_spec(max_k=2), p, max_batch_size=8).serving_bucket(1) is None
    from dsd_jax.config import SpecConfig
    static = Controller(SpecConfig(num_speculative_tokens=2), None, max_batch_size=8, batch_buckets=[1, 2, 8])
    assert [static.serving_bucket(b) for b in (1, 3)] == [1, 8]  # no profile: the smallest
    with pytest.raises(ValueError, match="batch_size"):
        ctl.serving_bucket(9)


def test_model_rebuilds_its_rows_only_when_a_factor_moved():
    p = realistic_profile()
    lm = LatencyModel(p, max_batch_size=8, num_k=3, batch_buckets=None, context_subdivisions=8, forgetting=0.1)
    before = lm.itl_rows(0)
    assert lm.learn(8, 1, 2.0 * p.itl_ms(8, 1), p.itl_ms(8, 1))  # the first observation rebuilds
    assert lm.itl_rows(0) is not before and lm.itl_rows(0)[8, 1] > before[8, 1]
    # the same ratio again leaves every factor where it was (one bucket mean, the global mean)
    assert not lm.learn(8, 1, 2.0 * p.itl_ms(8, 1), p.itl_ms(8, 1))
    assert not lm.learn(8, 3, 1.0, 1.0)  # K outside the model: ignored
    profile_ms, pred_ms = lm.predict_ms(8, 1, None)
    assert pred_ms == pytest.approx(profile_ms * lm.correction.factors(8)[1])
    assert lm.weights(8)[1] > 0 and lm.learnt_weight == lm.correction.learnt_weight

def test_a_uniformly_slower_machine_changes_no_choice():
    p = realistic_profile()
    learning = Controller(goodput_spec(warmup_steps=0, latency_forgetting=0.02), p, max_batch_size=64,
                          batch_buckets=[1, 4, 16, 64])
    trusting = Controller(goodput_spec(warmup_steps=0, latency_forgetting=0.0), p, max_batch_size=64,
                          batch_buckets=[1, 4, 16, 64])
    rng = np.random.default_rng(1)
    for _ in range(300):
        b = int(rng.choice([1, 3, 4, 9, 16, 40, 64]))
        k = int(rng.integers(0, 7))
        accepted = rng.integers(0, k + 1, b)
        ms = 1.5 * p.itl_ms(learning._latency.bucket(b), k)
        for c in (learning, trusting):
            c.observe(k, accepted, step_time_s=ms / 1e3)
    for b in range(1, 65):
        np.testing.assert_allclose(learning.predicted_goodput(b), trusting.predicted_goodput(b) / 1.5, rtol=1e-9)


def test_exploration_stops_once_contenders_are_learnt():
    p = realistic_profile()
    c = Controller(goodput_spec(warmup_steps=0, probe_interval=4, latency_forgetting=0.02, explore_gap=0.3), p,
                   max_batch_size=64)
    acc = np.array(p.acceptance)
    rng = np.random.default_rng(2)
    ks = _run(c, 8, lambda k: p.itl_ms(8, k), acc, 600, rng)
    g = brute_goodput(p, acc, 8, None, 6)
    contenders = [k for k in range(7) if k != 2 and g[k] >= 0.7 * g[2]]
    assert contenders and all(ks.count(k) >= 16 for k in contenders)
    assert all(ks.count(k) == 0 for k in range(7) if g[k] < 0.7 * g[2])
    assert all(c._latency.weights(8)[k] >= c._latency.learnt_weight for k in contenders)
    # every contender has been timed enough: no more probes (no acceptance probes at a held K > 0)
    probes = c.stats()["probes"]
    _run(c, 8, lambda k: p.itl_ms(8, k), acc, 200, rng)
    assert c.stats()["probes"] == probes
