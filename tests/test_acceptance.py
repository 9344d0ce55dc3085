"""Acceptance estimators: prior and warm-up, forgetting, extrapolation, per-request shrinkage."""

import numpy as np
import pytest

from dsd_jax.acceptance import (PRIOR_MIN_REQUESTS, ROW_PRIOR_STEPS, SPREAD_FORGETTING, SPREAD_MIN_STEPS,
                                GlobalAcceptance, RequestAcceptance, al_curve, conditional_rates, expected_max_normal,
                                padded_prior, tokens_variance)

PRIOR = np.array([0.8, 0.6, 0.4, 0.2])


def test_al_curve_is_one_plus_cumulative_acceptance_on_the_last_axis():
    np.testing.assert_array_equal(al_curve(np.array([0.5, 0.25, 0.125]), 2), [1.0, 1.5, 1.75])
    rows = np.array([[1.0, 1.0], [0.5, 0.0]])
    np.testing.assert_array_equal(al_curve(rows, 2), [[1.0, 2.0, 3.0], [1.0, 1.5, 1.5]])
    np.testing.assert_array_equal(al_curve(rows, 0), [[1.0], [1.0]])


def test_padded_prior():
    assert np.isnan(padded_prior(None, 3)).all()
    np.testing.assert_array_equal(padded_prior([0.9, 0.5], 3), [0.9, 0.5, np.nan])
    np.testing.assert_array_equal(padded_prior([0.9, 0.5, 0.3], 2), [0.9, 0.5])
    assert padded_prior([0.9], 0).shape == (0,)


def test_prior_until_warmup_then_live():
    g = GlobalAcceptance(PRIOR, forgetting=0.5, warmup_steps=2)
    np.testing.assert_array_equal(g.estimate, PRIOR)
    g.observe(4, np.array([4, 4]))
    assert not g.live and g.steps == 1
    np.testing.assert_array_equal(g.estimate, PRIOR)  # still warming up
    g.observe(4, np.array([4, 4]))
    assert g.live
    np.testing.assert_array_equal(g.estimate, [1.0, 1.0, 1.0, 1.0])
    assert g.al == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_without_prior_live_data_is_used_at_once():
    g = GlobalAcceptance(padded_prior(None, 2), forgetting=0.1, warmup_steps=100)
    g.observe(2, np.array([1, 0]))
    np.testing.assert_array_equal(g.estimate, [0.5, 0.0])


def test_forgetting_discounts_history():
    f = 0.25
    g = GlobalAcceptance(PRIOR[:1], forgetting=f)
    g.observe(1, np.array([1, 1, 1, 1]))  # 4 of 4 accepted
    g.observe(1, np.array([0, 0]))  # 0 of 2: A = 0.75 * 4, N = 0.75 * 4 + 2
    assert g.estimate[0] == pytest.approx(3.0 / 5.0)
    for _ in range(200):  # at a steady batch size, the history fades geometrically
        g.observe(1, np.array([0, 0]))
    assert g.estimate[0] < 1e-20


def test_forgetting_one_keeps_only_the_last_step():
    g = GlobalAcceptance(PRIOR, forgetting=1.0)
    g.observe(2, np.array([2, 2, 2]))
    g.observe(2, np.array([1, 0, 0]))
    np.testing.assert_allclose(g.estimate[:2], [1 / 3, 0.0])


def test_unseen_positions_follow_the_prior_shape_and_stay_non_increasing():
    g = GlobalAcceptance(PRIOR, forgetting=0.1)
    g.observe(2, np.array([2, 2, 1, 0]))  # a_1 = 0.75, a_2 = 0.5 measured (c_2 = 2/3)
    # unreached drafts: the prior's rate, at least the last live one (c_3 = 2/3, c_4 = max(0.5, 2/3))
    np.testing.assert_allclose(g.estimate, [0.75, 0.5, 0.5 * 0.4 / 0.6, 0.5 * (2 / 3) ** 2])
    assert g.kseen == 2
    g = GlobalAcceptance(np.array([0.9, 0.0, 0.0]), forgetting=0.1)
    g.observe(1, np.array([1]))
    np.testing.assert_array_equal(g.estimate, [1.0, 1.0, 1.0])  # a zero prior too: at least the live rate
    g = GlobalAcceptance(np.array([0.5, np.nan]), forgetting=0.1)
    g.observe(1, np.array([1]))
    np.testing.assert_array_equal(g.estimate, [1.0, np.nan])  # no prior, no data: unknown


def test_a_stretch_at_k1_moves_every_position_not_just_the_first():
    """Conditional rates: K = 4 steps teach c_2..c_4, a later stretch of K = 1 steps with
    a lower first-draft rate moves a_2..a_4 with a_1 (counted unconditionally, they kept
    the K = 4 stretch's values, and the estimate went flat at a_1)."""
    g = GlobalAcceptance(PRIOR, forgetting=0.1)
    for _ in range(40):
        g.observe(4, np.array([4, 3, 2, 1, 0]))  # a = 0.8, 0.6, 0.4, 0.2: c = 0.8, 3/4, 2/3, 1/2
    np.testing.assert_allclose(g.estimate, [0.8, 0.6, 0.4, 0.2])
    for _ in range(200):
        g.observe(1, np.array([1, 0, 0, 0]))  # the first draft now accepted a quarter of the time
    np.testing.assert_allclose(g.rates[1:], [0.75, 2 / 3, 0.5])
    np.testing.assert_allclose(g.estimate, 0.25 * np.array([1.0, 0.75, 0.5, 0.25]), rtol=1e-6)


def test_conditional_rates_invert_the_product():
    a = np.array([[0.8, 0.6, 0.0, 0.0], [0.5, np.nan, np.nan, np.nan]])
    c = conditional_rates(a)
    np.testing.assert_allclose(c[0], [0.8, 0.75, 0.0, 0.0])  # after a zero: 0, not NaN
    assert c[1, 0] == 0.5 and np.isnan(c[1, 1:]).all()
    np.testing.assert_allclose(np.cumprod(c[0]), a[0])


def test_estimate_is_replaced_not_mutated():
    g = GlobalAcceptance(PRIOR, forgetting=0.1)
    before = g.estimate
    g.observe(3, np.array([3, 0]))
    assert g.estimate is not before
    np.testing.assert_array_equal(before, PRIOR)


def test_a_repeated_estimate_is_the_same_numbers_as_a_fresh_one():
    """`estimate` returns its last result when asked again for the same rows before anything
    changed (the controller's choice and its round's score): through random rounds, finished
    requests and new rows it equals a recomputation bit for bit, at every K up to the last
    one asked, and sums alike (contiguous); what it keeps is read-only, `request` gives a copy. The
    global AL curve, summed in plain Python, is `al_curve`'s."""
    rng = np.random.default_rng(3)
    g, rq = _requests(prior=np.array([0.8, 0.6, 0.4, 0.2, np.nan, np.nan]), forgetting=0.2)
    live, next_id = ["r0", "r1", "r2"], 3
    for step in range(300):
        k = int(rng.integers(1, 7))
        rows = rq.rows_for(live)
        first = rq.estimate(rows, 6)
        again = [rq.estimate(rows, j) for j in (6, k, 1)]
        rq.counts_changed()
        fresh = [rq.estimate(rows, j) for j in (6, k, 1)]
        for a, f in zip(again, fresh):
            np.testing.assert_array_equal(a, f)
            assert a.flags.c_contiguous and a.sum() == f.sum()
        np.testing.assert_array_equal(first, fresh[0])
        assert again[0] is first and not first.flags.writeable  # kept, and returned again
        acc = np.minimum(rng.geometric(0.3, len(live)) - 1, k)
        g.observe(k, acc)
        rq.observe(rows, acc, k)
        np.testing.assert_array_equal(g.al, al_curve(g.estimate, 6))  # NaN where unknown
        if rng.random() < 0.2:  # a request finishes, another takes its row
            rq.forget(live.pop(int(rng.integers(len(live)))))
            live.append(f"r{next_id}")
            next_id += 1
    mine = rq.request(live[0])
    mine[:] = -1.0
    assert (rq.request(live[0]) >= 0).all()


def _requests(prior=PRIOR, forgetting=0.5):
    g = GlobalAcceptance(prior, forgetting=forgetting)
    return g, RequestAcceptance(g)


def test_new_request_starts_at_the_global_estimate():
    g, rq = _requests()
    rows = rq.rows_for(["a", "b"])
    np.testing.assert_allclose(rq.estimate(rows, 4), [PRIOR, PRIOR])
    np.testing.assert_allclose(rq.request("a"), PRIOR)
    assert rq.request("unseen") is None


def test_request_estimate_is_shrunk_toward_the_global_one():
    g, rq = _requests(forgetting=0.5)
    g_est = g.estimate.copy()
    rows = rq.rows_for(["easy"])
    rq.observe(rows, np.array([4]), 4)  # one step, every draft accepted: own rates 1
    rates = conditional_rates(g_est)  # each conditional rate is shrunk, a_i is their product
    expected = np.cumprod((1.0 + ROW_PRIOR_STEPS * rates) / (1.0 + ROW_PRIOR_STEPS))
    np.testing.assert_allclose(rq.request("easy"), expected)
    for _ in range(100):  # its own evidence saturates at 1 / forgetting = 2 steps
        rq.observe(rows, np.array([4]), 4)
    np.testing.assert_allclose(rq.request("easy"),
                               np.cumprod((2.0 + ROW_PRIOR_STEPS * rates) / (2.0 + ROW_PRIOR_STEPS)))
    assert np.all(rq.request("easy") > g_est)


def test_shrinkage_target_follows_the_global_estimate():
    g, rq = _requests(forgetting=1.0)
    rq.rows_for(["a"])
    np.testing.assert_allclose(rq.request("a"), PRIOR)
    g.observe(4, np.array([4, 4]))  # the global estimate moves to all-accepted
    np.testing.assert_allclose(rq.request("a"), [1.0, 1.0, 1.0, 1.0])


def test_rows_start_at_the_finished_requests_mean_first_draft_rate_not_the_steps():
    """Three easy requests of 3 steps and one hard one of 30 finish: a fresh row starts at
    their request-weighted rate at draft 1 (each request weighs one), not at the global
    rate, which the hard request's 30 steps hold near zero (at B = 1, the last request's).
    Deeper drafts keep the global rates."""
    g = GlobalAcceptance(PRIOR, forgetting=0.05)
    rq = RequestAcceptance(g)
    for rid, steps, n in (("e1", 3, 2), ("e2", 3, 2), ("e3", 3, 2), ("hard", 30, 0)):
        row = rq.rows_for([rid])
        for _ in range(steps):
            g.observe(2, np.array([n]))
            rq.observe(row, np.array([n]), 2)
        rq.forget(rid)
    assert g.rates[0] < 0.25
    target = rq.shrink_target()
    weights = (1.0 - SPREAD_FORGETTING) ** np.arange(3, -1, -1)  # e1, e2, e3, hard: newer weigh more
    np.testing.assert_allclose(target[0], weights[:3].sum() / weights.sum())  # ~0.75
    np.testing.assert_allclose(target[1:], g.rates[1:])
    fresh = rq.estimate(rq.rows_for(["fresh"]), 4)[0]
    np.testing.assert_allclose(fresh, np.cumprod(target))


def test_the_finished_mean_needs_enough_requests_that_ran_drafts_and_ignores_abandoned_ones():
    """Below PRIOR_MIN_REQUESTS finished requests that ran drafts the global rate stands at
    draft 1 too; a request forgotten unfinished (its run abandoned), or one that ran no
    drafts, does not count."""
    g, rq = _requests(forgetting=0.05)
    for i in range(PRIOR_MIN_REQUESTS):
        row = rq.rows_for([i])
        rq.observe(row, np.array([4]), 4)
        rq.forget(i, finished=i == 0)  # only the first one finishes
    rq.rows_for(["no drafts"])
    rq.forget("no drafts")
    np.testing.assert_allclose(rq.shrink_target(), np.nan_to_num(g.rates))
    for i in range(PRIOR_MIN_REQUESTS, 2 * PRIOR_MIN_REQUESTS - 1):
        rq.observe(rq.rows_for([i]), np.array([0]), 4)
        rq.forget(i)
    weights = (1.0 - SPREAD_FORGETTING) ** np.arange(PRIOR_MIN_REQUESTS - 1, -1, -1)  # one accepted, then none
    np.testing.assert_allclose(rq.shrink_target()[0], weights[0] / weights.sum())
    np.testing.assert_allclose(rq.shrink_target()[1:], np.nan_to_num(g.rates)[1:])


def test_a_row_seen_at_k1_only_extrapolates_with_its_own_first_draft_rate():
    """A row that accepted 5 of 20 first drafts, never run at K > 1, with the global rates
    at c = 0.8, 0.75, 0.67, 0.5: its later drafts follow its own level through the global
    conditionals, AL(4) = 1 + 2.5 a_1, where per-position shrinkage gave it 1 + 4 a_1
    (a_2..a_4 at the global 0.6, 0.4, 0.2 + its own nothing, cut to its a_1)."""
    g, rq = _requests(forgetting=0.01)
    rows = rq.rows_for(["hard"])
    for i in range(20):
        rq.observe(rows, np.array([int(i % 4 == 0)]), 1)
    est = rq.request("hard")
    a1 = est[0]
    assert 0.25 < a1 < 0.4  # 5 of 20 plus 4 rows at the global 0.8, lightly discounted
    np.testing.assert_allclose(est, a1 * np.cumprod([1.0, 0.75, 2 / 3, 0.5]))
    assert al_curve(est, 4)[4] == pytest.approx(1 + 2.5 * a1)


def test_request_counts_only_positions_proposed():
    g, rq = _requests(forgetting=1.0)
    rows = rq.rows_for(["a", "b"])
    rq.observe(rows, np.array([2, 0]), 2)
    np.testing.assert_array_equal(rq.accepted[rows], [[1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(rq.proposed[rows], [[1, 1, 0, 0], [1, 1, 0, 0]])


def test_forget_request_frees_and_resets_its_row():
    g, rq = _requests()
    (r,) = rq.rows_for(["a"])
    rq.observe(np.array([r]), np.array([0]), 4)
    assert rq.request("a")[0] < PRIOR[0]
    rq.forget("a")
    rq.forget("never seen")  # no-op
    assert rq.request("a") is None and "a" not in rq.row_of
    (r2,) = rq.rows_for(["b"])
    assert r2 == r  # the freed row is reused, from zero counts
    np.testing.assert_allclose(rq.request("b"), PRIOR)


def test_rows_grow_and_keep_their_counts():
    g, rq = _requests(forgetting=1.0)
    first = rq.rows_for(["r0"])
    rq.observe(first, np.array([4]), 4)
    ids = [f"r{i}" for i in range(40)]
    rows = rq.rows_for(ids)
    assert len(set(rows.tolist())) == 40 and rows[0] == first[0]
    assert rq.accepted.shape[0] >= 40
    np.testing.assert_array_equal(rq.accepted[first[0]], [1, 1, 1, 1])
    np.testing.assert_allclose(rq.request("r39"), PRIOR)


def test_expected_max_normal_matches_the_known_values():
    # E[max of n standard normals] (tables: Harter 1961); n = 2 is 1 / sqrt(pi)
    for n, exact in ((1, 0.0), (2, 0.5642), (4, 1.0294), (8, 1.4236), (10, 1.5388), (16, 1.7660), (50, 2.2491), (100, 2.5076)):
        assert expected_max_normal(n) == pytest.approx(exact, abs=1e-3)


def _finish(rq, rid, num_accepted, k, steps):
    """A request that accepts num_accepted[step] drafts (or the same count every step)."""
    rows = rq.rows_for([rid])
    for n in np.broadcast_to(num_accepted, (steps,)):
        rq.observe(rows, np.array([n]), k)
    rq.forget(rid)


def test_tokens_variance_of_nested_acceptance_events():
    rng = np.random.default_rng(0)
    a = np.array([0.8, 0.6, 0.3, 0.1])
    # n >= i with P(n >= i) = a_i: n = number of thresholds a single uniform falls under
    n = (rng.random(200_000)[:, None] < a).sum(axis=1)
    for k in range(5):
        assert tokens_variance(a)[k] == pytest.approx(np.minimum(n, k).var(), abs=0.01)
    np.testing.assert_array_equal(tokens_variance(np.array([1.0, 1.0, 0.0])), np.zeros(4))


def test_spread_is_the_deviation_of_finished_requests_al_curves():
    g, rq = _requests(forgetting=0.05)
    np.testing.assert_array_equal(rq.spread(), np.zeros(5))  # nothing finished yet
    counts = [4, 0, 4, 0, 2, 1]  # deterministic requests: no sampling noise to take off
    for i, n in enumerate(counts):
        _finish(rq, f"r{i}", n, 4, steps=12)
    als = [al_curve((n >= np.arange(1, 5)).astype(float), 4) for n in counts]
    w = (1 - 1 / 32) ** np.arange(len(als))[::-1]  # the newest weighs most
    mean = np.average(als, axis=0, weights=w)
    std = np.sqrt(np.average((np.array(als) - mean) ** 2, axis=0, weights=w))
    np.testing.assert_allclose(rq.spread(), std, atol=1e-12)
    # one step cannot tell its rate from luck: it counts as a request at the mean (no news
    # fades the spread, so one learnt before a hold at K = 0 does not price probes out for good)
    _finish(rq, "thin", 4, 4, steps=1)
    assert SPREAD_MIN_STEPS > 1
    w = np.append(w * (1 - 1 / 32), 1.0)
    std = np.sqrt(np.average(np.append((np.array(als) - mean) ** 2, [np.zeros(5)], axis=0), axis=0, weights=w))
    np.testing.assert_allclose(rq.spread(), std, atol=1e-12)


@pytest.mark.parametrize("rates", [(0.6,), (0.9, 0.3)])
def test_spread_takes_the_sampling_noise_off(rates):
    """Requests that accept alike differ only by chance: (almost) no spread, where their
    raw AL(4) estimates differ by about 0.27. Two kinds of request (geometric acceptance
    0.9 and 0.3, AL(4) 4.10 and 1.43): the spread is theirs, 1.33."""
    g, rq = _requests(forgetting=0.05)
    rng = np.random.default_rng(1)
    for i in range(400):
        _finish(rq, i, np.minimum(rng.geometric(1 - rates[i % len(rates)], size=20) - 1, 4), 4, steps=20)
    true_al = np.std([al_curve(r ** np.arange(1.0, 5.0), 4) for r in rates], axis=0)
    if len(rates) == 1:
        assert np.all(rq.spread() < 0.12)
    else:
        np.testing.assert_allclose(rq.spread()[1:], true_al[1:], rtol=0.1)


def pinned(rq, rid, a):
    """White-box: request `rid`'s own counts pin its estimate at a (a_1..a_max_k, or one
    a for every position); its row. Shared with test_controller and test_makespan."""
    (r,) = rq.rows_for([rid])
    a = np.broadcast_to(np.asarray(a, dtype=float), (rq.max_k,))
    rq.accepted[r], rq.reached[r], rq.proposed[r] = a * 1e15, np.r_[1.0, a[:-1]] * 1e15, 1e15
    rq.counts_changed()
    return r


def test_drafts_a_row_never_proposed_take_at_least_its_last_proposed_rate():
    """An easy row seen at K = 2 is credited at drafts 3-4 with its own draft-2 rate (above
    the global one); a hard row, below the global rate, keeps the global rates there; a
    row seen at every K is its own counts throughout."""
    g, rq = _requests()
    easy, hard, full = rq.rows_for(["easy", "hard", "full"])
    for _ in range(6):
        rq.observe(np.array([easy, hard]), np.array([2, 0]), 2)
        rq.observe(np.array([full]), np.array([4]), 4)
    c = conditional_rates(rq.estimate(np.array([easy, hard, full]), 4))
    g_rates = np.nan_to_num(g.rates)
    assert c[0, 1] > g_rates[2] and np.allclose(c[0, 2:], c[0, 1])
    np.testing.assert_allclose(c[1, 2:], g_rates[2:4])
    own = (rq.accepted[full] + ROW_PRIOR_STEPS * g_rates) / (rq.reached[full] + ROW_PRIOR_STEPS)
    np.testing.assert_allclose(c[2], own)


@pytest.mark.parametrize("rate, k", [(0.6, 3), (0.8, 2), (0.3, 1)])
def test_makespan_steps_is_the_slowest_of_b_rows_that_accept_alike(rate, k):
    """Eight rows with the same geometric acceptance need 48 tokens each: the batch
    lasts E[max of 8 step counts], which a simulation gives; one row's own count is R / AL."""
    g, rq = _requests()
    a = rate ** np.arange(1.0, 5.0)
    rows = np.array([pinned(rq, i, a) for i in range(8)])
    rem = np.full(8, 48.0)
    steps = rq.makespan_steps(rows, rem, k, batch_size=8)
    al = al_curve(a, k)
    np.testing.assert_allclose(rq.makespan_steps(rows, rem, k, batch_size=1), 48.0 / np.tile(al, (8, 1)))
    np.testing.assert_allclose(steps[:, 0], 48.0)  # K = 0: one token a step, no chance in it
    rng = np.random.default_rng(0)
    sims = []
    for _ in range(2000):
        left, n = np.full(8, 48), 0
        while (left > 0).any():
            left -= 1 + np.minimum(rng.geometric(1 - rate, size=8) - 1, k)
            n += 1
        sims.append(n)
    assert steps[0, k] == pytest.approx(np.mean(sims), rel=0.05)  # 2-4% under it here
    assert steps[0, k] > 48.0 / al[k] * 1.05  # the mean row's count is not the batch's


def test_makespan_steps_adds_the_learnt_spread_on_rows_without_their_own_data():
    g, rq = _requests(forgetting=0.05)
    for i, n in enumerate([4, 0] * 4):
        _finish(rq, f"old{i}", n, 4, steps=12)
    spread = rq.spread()
    assert spread[4] > 1.0
    rows = rq.rows_for(["fresh", "seasoned"])
    for _ in range(40):
        rq.observe(rows[1:], np.array([4]), 4)
    est = np.minimum.accumulate(rq.estimate(rows, 4), axis=-1)
    al = al_curve(est, 4)
    rem = np.array([48.0, 48.0])
    noise = 48.0 * tokens_variance(est, 4) / al**3
    hidden = ROW_PRIOR_STEPS / (ROW_PRIOR_STEPS + rq.proposed[rows, 0])
    assert hidden[0] == 1.0 and hidden[1] < 0.2  # its own counts saturate at 1 / forgetting = 20 steps
    expected = 48.0 / al + expected_max_normal(8) * np.sqrt(noise + (48.0 / al**2) ** 2 * hidden[:, None] * spread**2)
    np.testing.assert_allclose(rq.makespan_steps(rows, rem, 4, batch_size=8), expected)


def test_spread_past_the_drafts_requests_ran_scales_with_the_expected_drafts():
    """Requests that only ever ran K = 1 inform AL(1)'s spread alone; an unexplored K
    must not look safer than K = 1, so its spread grows with the drafts it expects."""
    g, rq = _requests(forgetting=0.05)
    for i in range(40):
        _finish(rq, i, np.tile([1] * 9 + [0] if i % 2 else [0] * 9 + [1], 2), 1, steps=20)
    spread = rq.spread()
    assert spread[1] > 0.3  # rates 0.9 and 0.1
    drafts = np.array(al_curve(g.estimate, 4)) - 1.0
    np.testing.assert_allclose(spread[2:], spread[1] * drafts[2:] / drafts[1])
    assert np.all(np.diff(spread) > 0)
