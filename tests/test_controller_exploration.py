"""The controller keeps exploring where its estimates could be stuck, and cheaply.

Seeded simulations against the real `Controller`, one per finding of the controller
audit: drafts a held K never proposes (or stopped proposing), ... Step times are the
profile's ITL; nothing here is timed.
"""

import numpy as np
import pytest

from dsd_jax.controller import Controller
from test_controller import goodput_spec, realistic_profile

PROF = realistic_profile()  # acceptance 0.8, 0.65, 0.5, 0.4, 0.3, 0.25; max K 6


def _queue(c, b, steps, accept):
    """`steps` one-round dispatches at batch size b (a queue refills every row);
    accept(step, k) -> drafts accepted per row. Returns the K of each step."""
    ks = []
    for s in range(steps):
        k = c.choose_k(b)
        c.observe(k, accept(s, k) if k else [0] * b, PROF.itl_ms(b, k) / 1e3)
        ks.append(k)
    return ks


# ---------------------------------------------------------------- drafts above the held K


@pytest.mark.parametrize("b", [1, 4, 16])
def test_a_held_k_whose_drafts_are_all_accepted_tries_more(b):
    """Every draft accepted: K = 6 is the fastest at B = 1-16 (AL = K + 1). The drafts above
    the held K are never proposed; at the profile's rates there K = 4 (B=1), 3 (B=4) or
    1 (B=16) was held for good. At least the last live rate there: K = 6."""
    c = Controller(goodput_spec(objective="throughput"), PROF, max_batch_size=64)
    _queue(c, b, 300, lambda s, k: [k] * b)
    assert c.current_k == 6


@pytest.mark.parametrize("b", [1, 4])
def test_rates_left_by_a_hard_stretch_fade_once_their_drafts_are_not_proposed(b):
    """200 steps accepting the first draft only, then every draft. The first stretch left
    rates of 0 at drafts 2-6; held at K = 1, nothing proposed them again, and K = 1 was held
    for good (1.45x K = 6's time at B = 1). Their counts fade: K = 6 comes back."""
    c = Controller(goodput_spec(objective="throughput"), PROF, max_batch_size=64)
    ks = _queue(c, b, 600, lambda s, k: [min(k, 1) if s < 200 else k] * b)
    assert ks[199] == 1 and c.current_k == 6


def _rows(rng, k, rate, b):
    """Drafts accepted per row when each draft is accepted with probability `rate` until
    the first rejection."""
    if not k:
        return np.zeros(b, int)
    ok = rng.random((b, k)) < rate
    return np.where(ok.all(1), k, np.argmin(ok, axis=1))


# ---------------------------------------------------------------- the draft's catch-up


def test_the_catch_up_in_a_probe_does_not_price_later_probes_out():
    """A K > 0 round after K = 0 rounds also runs the draft's catch-up on what it skipped
    (here 2 K = 0 steps' time, charged to that round as the engine's wall clock does).
    Learnt into the (bucket, K) latency factor, it made K = 1 17% dearer than profiled at
    B = 16 (K = 0: 5%), the profile's acceptance no longer beat K = 0 there, and probes
    stopped for good: acceptance back at 0.9 after a bad stretch was never seen. Such a
    round does not train the latency factors, so probes go on and speculation comes back."""
    b, rng = 16, np.random.default_rng(0)
    c = Controller(goodput_spec(objective="throughput"), PROF, max_batch_size=64)
    ks, prev = [], 0
    for s in range(1500):
        rate = 0.05 if 150 <= s < 750 else 0.9
        k = c.choose_k(b)
        ms = PROF.itl_ms(b, k) + (2.0 * PROF.itl_ms(b, 0) if k and not prev else 0.0)
        c.observe(k, _rows(rng, k, rate, b), ms / 1e3)
        ks.append(prev := k)
    assert np.mean(np.array(ks[750:1050]) == 0) > 0.5  # the bad stretch was held at K = 0 ...
    assert np.mean(np.array(ks[-300:]) > 0) > 0.9  # ... and left once acceptance was back
    assert np.ptp(c.stats()["latency_factors"][b]) < 0.01  # no K looks dearer than another


# ---------------------------------------------------------------- the makespan's spread


def _groups(c, b, n, tokens, rates, rng, tag):
    """n groups of b requests of `tokens` tokens each, nothing refilling their slots (the
    makespan objective's regime), one round a choice; rates(group) -> each row's rate.
    Returns (the K of each step, time in ms at the profile's ITL)."""
    ks, t = [], 0.0
    for g in range(n):
        ids, done, rate = [f"{tag}{g}.{i}" for i in range(b)], np.zeros(b), np.asarray(rates(g))
        while done.min() < tokens:
            k = c.choose_k(b, request_ids=ids, remaining=(tokens - done).tolist())
            acc = np.array([_rows(rng, k, r, 1)[0] for r in rate])
            c.observe(k, acc, PROF.itl_ms(b, k) / 1e3, request_ids=ids)
            done += acc + 1
            ks.append(k)
            t += PROF.itl_ms(b, k)
        for rid in ids:
            c.forget_request(rid)
    return ks, t


def test_a_spread_learnt_before_a_hold_at_k0_fades_so_probes_resume():
    """Makespan objective (the default), B = 8. A mixed workload (half the rows accept
    0.95, half 0.1) teaches a wide spread between requests and holds K = 0; priced with it,
    not even the profile's acceptance beats K = 0 for the slowest row, so no probe ran,
    no request ran drafts, and the spread never moved: later groups where every row
    accepts 0.9 ran K = 0 for good (1.39x a fresh controller's time). A request that ran
    no drafts now counts as one at the mean: the spread fades and probes resume."""
    b, rng = 8, np.random.default_rng(0)
    c = Controller(goodput_spec(), PROF, max_batch_size=64)
    _groups(c, b, 5, 200, lambda g: [0.95, 0.1] * (b // 2), rng, "mixed")
    assert c._requests.spread()[1] > 0.2 and c.current_k == 0
    ks, _ = _groups(c, b, 12, 200, lambda g: [0.9] * b, rng, "easy")
    assert np.mean(np.array(ks[-300:]) > 0) > 0.8
