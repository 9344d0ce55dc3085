"""`dsd_jax.probes` on its own: the pricing of a probe at a held K = 0 and one controller's
probe state, without a controller around them (the controller's use of them is
`test_controller_exploration.py`)."""

import numpy as np

from dsd_jax.probes import FOLLOW_UPS, OPTIMISTIC_SHARE, PROBE_SHARE, Prober, probe_plan

ITL = np.array([[10.0, 12.0, 14.0, 16.0]])  # ms per step at K = 0..3


def _plan(al_prior, al_opt=(1.0, 2.0, 3.0, 4.0), excess=0.0, catchup=0.0, interval=4):
    return [x.item() for x in probe_plan(np.array([al_prior]) / ITL, np.array([al_opt]) / ITL, ITL,
                                         np.array([excess]), np.array([catchup]), 1.02, interval)]


def test_an_acceptance_probe_runs_the_profiles_best_k_and_is_spaced_by_its_share():
    # profile AL(K) = 1, 1.5, 1.8, 2.0: G/G0 = 1, 1.25, 1.286, 1.25 -> K = 2, gain 0.286,
    # extra 0.4 K = 0 steps: every ceil(0.4 / (0.25 * 0.286)) = 6 choices
    k, every, rounds, optimistic = _plan((1.0, 1.5, 1.8, 2.0))
    assert (k, every, rounds, optimistic) == (2, int(np.ceil(0.4 / (PROBE_SHARE * (1.8 / 1.4 - 1)))), 0, False)
    # a measured excess of 3 K = 0 steps: 3.4 / 0.0714 = 48 rounds, capped at 4 x 6
    assert _plan((1.0, 1.5, 1.8, 2.0), excess=3.0)[2] == 24


def test_an_optimistic_probe_runs_only_where_the_profile_would_never_speculate():
    # the profile never beats K = 0; perfect acceptance does at K = 1 (2 / 1.2 = 1.67)
    k, every, rounds, optimistic = _plan((1.0, 1.1, 1.15, 1.2), catchup=1.0)
    assert optimistic and k == 1 and rounds == 0
    assert every == int(np.ceil(((12.0 + 1.0) / 10.0 - 1.0) / OPTIMISTIC_SHARE))  # 30: its step and catch-up
    # nothing runs where K = 0 wins even at perfect acceptance
    assert _plan((1.0, 1.0, 1.0, 1.0), al_opt=(1.0, 1.1, 1.2, 1.3))[0] == 0


def test_a_prober_follows_a_winning_probe_up_at_most_follow_ups_times():
    p = Prober(interval=4, one_plus_margin=1.02, prior_al=np.array([1.0, 1.5, 1.8, 2.0]))
    ks = []
    for _ in range(40):
        k = p.choose(0, lambda: 0, 2, 4) if p.due() else 0
        ks.append(k)
        p.observe(k, 1.0 + k, lambda: True)  # every draft accepted, every step a winner
    probes = [i for i, k in enumerate(ks) if k]
    assert probes[0] == 3 and probes[1:FOLLOW_UPS + 1] == list(range(4, 4 + FOLLOW_UPS))
    assert probes[FOLLOW_UPS + 1] == 3 + FOLLOW_UPS + 4  # the chain ended: the interval again
    assert p.count == len(probes)


def test_a_probe_in_flight_is_dropped_at_the_end_of_a_run():
    p = Prober(interval=1, one_plus_margin=1.02, prior_al=np.array([1.0, 1.5]))
    assert p.due() and p.choose(0, lambda: 0, 1, 1) == 1
    assert p.may_come_next(10**6)  # in flight: its result may call for a follow-up
    p.end_run()
    p.observe(1, 2.0, lambda: True)  # observed after the run ended: no follow-up
    assert not p.may_come_next(10**6)
