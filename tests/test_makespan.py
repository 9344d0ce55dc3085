"""The makespan objective: K for the critical request of a batch that nothing refills."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsd_jax.acceptance import expected_max_normal
from dsd_jax.controller import Controller
from dsd_jax.profile import Profile
from test_acceptance import pinned
from test_controller import goodput_spec, random_profile, realistic_profile


def _controllers(profile, **dyn):
    """(throughput, makespan) controllers with live acceptance from the first step."""
    kw = dict(warmup_steps=0, forgetting=0.2, margin=0.0, probe_interval=0, **dyn)
    return (Controller(goodput_spec(objective="throughput", **kw), profile),
            Controller(goodput_spec(objective="makespan", **kw), profile))


def test_one_hard_row_holds_the_batch_at_the_k_that_suits_it():
    """15 rows accept every draft, one none: the batch mean says speculate, but the
    hard row gains nothing from drafts and the group waits for it."""
    p = realistic_profile(max_k=6, acceptance=(0.5,) * 6)
    thr, mk = _controllers(p)
    ids = [f"r{i}" for i in range(16)]
    for _ in range(30):
        for c in (thr, mk):
            c.observe(6, [6] * 15 + [0], request_ids=ids)
    equal = [64] * 16
    assert thr.choose_k(16, request_ids=ids) >= 4
    assert mk.choose_k(16, request_ids=ids, remaining=equal) == 0
    # Once the hard row is nearly done, an easy row is critical again.
    assert mk.choose_k(16, request_ids=ids, remaining=[64] * 15 + [1]) >= 4


def test_a_hard_row_alone_in_the_tail_is_not_credited_with_drafts_it_never_ran():
    """Three rounds at K = 4, then K = 1 once one row lagged; that row, accepting a quarter
    of its first drafts, finishes alone. Its later drafts follow its own first-draft rate
    through the batch's conditional rates: AL(4) = 1.88, K = 0. (Counting each position
    on its own, a_2 = 0.34 rested on the K = 4 rounds and the global estimate: AL(2) = 1.67
    and K = 2, the bench_full_s12-like tail at B = 4 that ran K = 4 accepting nothing.)"""
    p = realistic_profile(max_k=4, acceptance=(0.8, 0.65, 0.5, 0.4))
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, forgetting=0.05, margin=0.03, probe_interval=0,
                                objective="makespan"), p)
    ids = ["a", "b", "c", "hard"]
    for n in ([4, 2, 3, 0], [1, 4, 2, 0], [3, 1, 4, 0]):
        c.observe(4, n, request_ids=ids)
    for i in range(16):
        c.observe(1, [1, 1, int(i % 3 > 0), int(i % 4 == 0)], request_ids=ids)
    a = c.request_acceptance("hard")
    np.testing.assert_allclose(a / a[0], c.acceptance_estimate() / c.acceptance_estimate()[0], rtol=0.25)
    assert c.choose_k(1, request_ids=["hard"], remaining=[20]) == 0


def test_without_remaining_it_is_the_throughput_controller():
    """While requests are queued (the engine passes no budgets) both objectives agree."""
    p = realistic_profile(max_k=4, acceptance=(0.8, 0.6, 0.4, 0.2))
    thr, mk = _controllers(p)
    rng = np.random.default_rng(0)
    for _ in range(200):
        b = int(rng.integers(1, 65))
        ids = list(range(b))
        k = thr.choose_k(b)
        assert mk.choose_k(b, request_ids=ids) == k
        acc = rng.binomial(k, 0.6, size=b)
        thr.observe(k, acc, request_ids=ids)
        mk.observe(k, acc, request_ids=ids)
    assert mk.objective == "makespan" and thr.objective == "throughput"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=random_profile(),
       rows=st.lists(st.tuples(st.floats(0, 1), st.integers(-2, 300)), min_size=1, max_size=8))
def test_makespan_choice_is_bruteforce_argmax_of_critical_progress(prof, rows):
    """K minimises the steps of the row that finishes last, times ITL(B, K): per row
    R / AL + z_B sd, where a row accepting each draft with probability a (here all or
    none: a_i = a for every i) makes K a (1 - a) K tokens of variance per step and so
    R K^2 a (1 - a) / AL^3 steps^2 (budgets below 1 count as 1; a K past R - 1 takes
    K = R - 1's steps: a step emits at most K + 1 of a row's tokens)."""
    kmax = prof.max_k
    c = Controller(goodput_spec(max_k=kmax, margin=0.0, probe_interval=0, objective="makespan"), prof)
    ids = [f"r{i}" for i in range(len(rows))]
    rem = [r for _, r in rows]
    c.choose_k(len(ids), request_ids=ids, remaining=rem)  # registers rows at the prior
    for rid, (a, _) in zip(ids, rows):
        pinned(c._requests, rid, a)
    b = len(ids)
    k = c.choose_k(b, request_ids=ids, remaining=rem)
    z = expected_max_normal(b)

    def steps(a, r, kk):
        r = max(r, 1)
        kk = min(kk, r - 1)
        al = 1 + kk * a
        return r / al + z * np.sqrt(r * kk * kk * a * (1 - a) / al**3)

    g = [1 / max(steps(a, r, kk) for a, r in rows) / prof.itl_ms(b, kk) for kk in range(kmax + 1)]
    assert g[k] == pytest.approx(max(g), rel=1e-9)


def test_rows_that_accept_alike_by_chance_still_wait_for_the_unluckiest():
    """Eight rows accepting half their drafts (all or none): the mean row would gain 4-6%
    from K = 1-2 at B=8, but the last of eight random step counts loses it."""
    p = realistic_profile(max_k=4, acceptance=(0.5,) * 4)
    c = Controller(goodput_spec(max_k=4, margin=0.0, probe_interval=0, objective="makespan"), p)
    ids = [f"r{i}" for i in range(8)]
    c.choose_k(8, request_ids=ids, remaining=[48] * 8)
    for rid in ids:
        pinned(c._requests, rid, 0.5)
    mean_row = [(1 + k * 0.5) / p.itl_ms(8, k) for k in range(5)]
    assert max(mean_row) > 1.04 * mean_row[0]
    assert c.choose_k(8, request_ids=ids, remaining=[48] * 8) == 0


def _decode_group(controller, budgets, accepts):
    """Decodes a fixed group to the end: request r may make budgets[r] tokens and accepts
    `accepts(r, k)` drafts of k. Yields (live rows, K run, K held) per step."""
    left = dict(budgets)
    while left:
        ids = list(left)
        k = controller.choose_k(len(ids), request_ids=ids, remaining=[left[r] for r in ids])
        acc = [accepts(r, k) for r in ids]
        controller.observe(k, acc, request_ids=ids)
        yield len(ids), k, controller.current_k
        for r, a in zip(ids, acc):
            left[r] -= a + 1
            if left[r] <= 0:
                del left[r]
                controller.forget_request(r)


def _run_group(controller, profile, easy_rows, hard_rows, budget):
    """Easy rows accept every draft, hard rows none. Returns the summed profiled step time (ms)."""
    budgets = {f"e{i}": budget for i in range(easy_rows)} | {f"h{i}": budget for i in range(hard_rows)}
    steps = _decode_group(controller, budgets, lambda r, k: k if r.startswith("e") else 0)
    return sum(profile.itl_ms(b, k) for b, k, _ in steps)


def test_makespan_objective_finishes_uneven_groups_sooner():
    """Groups of 16 with one or two rows that accept nothing: the batch-mean goodput
    speculates for the easy rows and leaves the hard ones to run their tail alone; the
    makespan objective learns within a group that the critical rows gain nothing.
    (Default settings: forgetting, margin and probes as shipped.)"""
    p = realistic_profile(max_k=6, acceptance=(0.7,) * 6)
    for hard in (1, 2):
        t = {obj: [_run_group(c, p, 16 - hard, hard, 64) for _ in range(5)]
             for obj, c in ((obj, Controller(goodput_spec(warmup_steps=0, objective=obj), p))
                            for obj in ("throughput", "makespan"))}
        assert t["makespan"][0] < 0.6 * t["throughput"][0], t  # the first group, from the profile
        assert sum(t["makespan"]) < 0.85 * sum(t["throughput"]), t


def _taught_spread(profile, **dyn):
    """A makespan controller whose finished requests accepted 0.9 or 0.3 of their drafts."""
    c = Controller(goodput_spec(max_k=1, warmup_steps=0, forgetting=0.5, explore_gap=0.0, objective="makespan",
                                **dyn), profile, max_batch_size=16)
    for g in range(8):
        ids = [f"old{g}_{i}" for i in range(2)]
        for step in range(10):
            c.observe(1, [1, int(step % 10 < 3)], request_ids=ids)
        for r in ids:
            c.forget_request(r)
    assert c._requests.spread()[1] > 0.25
    return c


def test_no_acceptance_probes_where_not_even_the_profiles_acceptance_would_move_the_hold():
    """Finished requests accepted 0.9 or 0.3 of their drafts. At B = 16 the slowest of 16
    fresh rows would lose at K = 1 even at the profile's acceptance (0.7): a probe there
    could not move the hold and only costs (the step, and the draft's catch-up), so the
    makespan objective runs none; at B = 1 (no slowest-of-B) it probes. Priced by the
    mean row, K = 1 wins 9% at B = 16 and the probes ran."""
    p = Profile("cpu", [1, 16], [0, 1], [[10.0, 12.0], [20.0, 31.0]], [0.7])
    c = _taught_spread(p, probe_interval=4)
    thr = Controller(goodput_spec(max_k=1, warmup_steps=0, forgetting=0.5, probe_interval=4, explore_gap=0.0,
                                  objective="throughput"), p, max_batch_size=16)
    for ctl in (c, thr):
        for _ in range(20):  # a bad stretch: K = 0 held
            ctl.observe(1, [0] * 16, request_ids=[f"bad{i}" for i in range(16)])
    for b, probes_expected in ((16, False), (1, True)):
        ids = [f"new{b}_{i}" for i in range(b)]
        ks = [c.choose_k(b, request_ids=ids, remaining=[64] * b) for _ in range(40)]
        assert (max(ks) > 0) == probes_expected, (b, ks)
    assert max(thr.choose_k(16) for _ in range(40)) == 1  # the mean row's price: probes


def test_held_k_asks_the_makespan_row_when_given_the_requests():
    """Admission prefills the drafter only where the next choice will speculate. At B = 16
    the mean row wins 9% at K = 1 and the slowest of 16 fresh rows loses: given the live
    requests and their budgets, `held_k` says K = 0, as `choose_k` then does (the batch
    mean's answer had the draft prefilled for every row of a K = 0 batch)."""
    p = Profile("cpu", [1, 16], [0, 1], [[10.0, 12.0], [20.0, 31.0]], [0.7])
    c = _taught_spread(p, probe_interval=0)
    for _ in range(4):  # the batch accepts 0.7 of first drafts, as the profile says
        c.observe(1, [1] * 7 + [0] * 3)
    ids = [f"new{i}" for i in range(16)]
    assert c.held_k(16) == 1  # the batch mean's row
    assert c.held_k(16, request_ids=ids, remaining=[64] * 16) == 0
    assert sum(c.stats()["k_choices"].values()) == 0 and c.current_k == 0  # asking chose nothing
    assert c.choose_k(16, request_ids=ids, remaining=[64] * 16) == 0
    assert c.held_k(1, request_ids=["alone"], remaining=[64]) == 1  # one row: no slowest-of-B


def test_under_data_parallelism_the_rows_are_every_shards_and_the_batch_the_fullest():
    """Two data shards of two rows: the step's time is a 2-row step's, the makespan that of
    the slowest of all four rows (the engine passes the fullest shard's count and every
    live id). Fewer ids than the batch is still an error."""
    p = realistic_profile(max_k=4, acceptance=(0.8, 0.65, 0.5, 0.4))
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, probe_interval=0, objective="makespan"), p)
    ids = list("abcd")
    k = c.choose_k(2, request_ids=ids, remaining=[20] * 4)
    assert k == c.held_k(2, request_ids=ids, remaining=[20] * 4)
    steps = c._requests.makespan_steps(c._requests.rows_for(ids), np.full(4, 20.0), 4, 4).max(axis=0)
    g = 1.0 / steps / np.array([p.itl_ms(2, kk) for kk in range(5)])
    assert k == int(np.argmax(g))
    with pytest.raises(ValueError, match="request_ids has 1 entries but batch_size is 2"):
        c.choose_k(2, request_ids=["a"], remaining=[20])


def test_fresh_groups_start_where_the_slowest_row_of_past_groups_was():
    """Half the rows accept 0.9 of drafts, half 0.4: the mean row would speculate, the
    slow rows gain less than a step costs at B=8. Shrunk toward the mean, eight fresh rows
    all look average, so the first group starts speculating; once finished requests
    have shown how far rows differ, a fresh group starts at K = 0, at about the same
    global acceptance. (Deterministic: an earlier version let probes and random
    acceptance teach it, and held in 3 of 10 seeds.)"""
    p = Profile("cpu", [1, 8], [0, 1], [[10.0, 11.0], [10.0, 14.4]], [0.65])
    c = Controller(goodput_spec(max_k=1, warmup_steps=0, probe_interval=0), p, max_batch_size=8)

    def fresh_group(g):
        ids = [f"g{g}r{i}" for i in range(8)]
        k = c.choose_k(8, request_ids=ids, remaining=[48] * 8)
        for r in ids:
            c.forget_request(r)
        return k

    assert fresh_group(0) == 1
    fast, slow = [1] * 9 + [0], [1, 0, 1, 0, 0, 1, 0, 1, 0, 0]  # 0.9 and 0.4 of drafts accepted
    for g in range(1, 9):
        ids = [f"g{g}r{i}" for i in range(8)]
        for s in range(20):
            c.observe(1, [(fast if i % 2 else slow)[s % 10] for i in range(8)], request_ids=ids)
        for r in ids:
            c.forget_request(r)
    assert abs(c.acceptance_estimate()[0] - 0.65) < 0.03
    assert c._requests.spread()[1] > 0.15  # white-box: the spread it learnt (0.25 between the two kinds)
    assert fresh_group(9) == 0


def test_a_row_accepting_every_draft_it_proposes_tries_more():
    """Alone (B = 1), a row accepts all K drafts each step. Its own data says nothing of
    draft K + 1; the rate there is taken as at least its rate at draft K, so it moves on
    to the largest K (with the global rate at draft 6, the profile's c_6 = 0.83, it
    stayed at K = 5 for good: the bench's easiest B=1 prompts, 10-15% below static K = 6)."""
    p = realistic_profile(max_k=6, acceptance=(0.7, 0.55, 0.45, 0.35, 0.3, 0.25))
    c = Controller(goodput_spec(max_k=6, warmup_steps=0, forgetting=0.05, margin=0.03, probe_interval=0,
                                objective="makespan"), p)
    ks = []
    for i in range(10):
        ks.append(c.choose_k(1, request_ids=["easy"], remaining=[60 - 5 * i]))
        c.observe(ks[-1], [ks[-1]], request_ids=["easy"])
    assert 0 < ks[0] < 6 and ks[-5:] == [6] * 5


def test_bad_remaining_is_refused():
    p = realistic_profile(max_k=4, acceptance=(0.8, 0.6, 0.4, 0.2))
    _, mk = _controllers(p)
    with pytest.raises(ValueError, match="remaining"):
        mk.choose_k(2, request_ids=["a", "b"], remaining=[3])
    with pytest.raises(ValueError, match="remaining"):
        mk.choose_k(2, request_ids=["a", "b"], remaining=[3, float("nan")])
    with pytest.raises(ValueError, match="remaining"):
        mk.choose_k(2, request_ids=["a", "b"], remaining=["x", "y"])
    assert mk.request_acceptance("a") is None  # a refused call registers no request
    assert mk.choose_k(0, request_ids=[], remaining=[]) == 0
