"""Probes: the controller's exploration at a held K = 0 (numpy only, no JAX).

K = 0 steps measure no acceptance, so a K = 0 hold taken on a bad stretch of live
acceptance could never be revised. Every ``dynamic.probe_interval``-th choice (dispatch)
may therefore run another K than the held one:

- An **acceptance probe** runs where the profile's acceptance would move the hold (its
  best K beats K = 0 by more than ``margin``). It runs that K, and only every few
  intervals where it is dear for what it could win (`acceptance_probe`): its extra time
  is at most ``PROBE_SHARE`` of the time saved if the profile's acceptance came back
  (under the makespan objective, the time the slowest live row would save, each row
  accepting at the profile's rates). What such a round is measured to cost beyond its
  step, the draft's catch-up, spaces them further, counted in K = 0 rounds, at most
  ``PROBE_COST_CAP`` times.
- An **optimistic probe** runs where not even the profile's acceptance would move the
  hold but perfect acceptance would (a profile can be far more pessimistic than the live
  drafts): the cheapest K that would win were every draft accepted, once so many K = 0
  rounds have passed that its extra time, the catch-up included, stays under
  ``OPTIMISTIC_SHARE`` (1%) of theirs (`optimistic_probe`).
- None runs where K = 0 wins even at perfect acceptance.

A probe whose step beats K = 0, accepting more than the estimate predicted (and, for an
acceptance probe starting a chain, at least the profile's AL(K)), is followed by up to
``FOLLOW_UPS`` more, a choice apart, so a return of acceptance moves the hold in a chain,
not a probe an interval, and live counts replace a pessimistic prior at one go.

Before those, with latency learning on and ``dynamic.explore_gap`` > 0 (off by default),
the controller's contender (`Controller._contender`, a close K whose latency is not learnt
yet) takes the probe's place. A probe is observed like any step; the held K changes only
through the controller's argmax.

`probe_plan` and its two parts are pure functions of goodput rows (one row, or the
controller's precomputed tables); `Prober` is one controller's probe state: choices since
the last probe, K = 0 rounds since the last K > 0 round, the probe in flight, the chain.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = [
    "FOLLOW_UPS", "OPTIMISTIC_SHARE", "PROBE_COST_CAP", "PROBE_SHARE", "Prober",
    "acceptance_probe", "optimistic_probe", "probe_plan",
]

# An acceptance probe at a held K = 0 may cost at most this share of what it could win:
# its extra step time over K = 0, spread over the dispatches between two probes, against
# the time per step the profile's acceptance says its K would save (`acceptance_probe`).
PROBE_SHARE = 0.25
# What a probe really costs (its step, and the draft's catch-up on the tokens it skipped,
# measured: `LatencyModel.probe_excess`) spaces acceptance probes further apart where it is
# dear, counted in K = 0 rounds, but at most this many times the spacing the profile's ITL
# gives: they never stop (a held K = 0 is only revised by them), and a return of acceptance
# is seen at most this many times later.
PROBE_COST_CAP = 4
# Where not even the profile's acceptance would speculate, but perfect acceptance would, an
# optimistic probe asks whether live acceptance is far above the profile's: its extra time
# (its step and the draft's catch-up) is at most this share of the K = 0 rounds between two.
OPTIMISTIC_SHARE = 0.01
# A probe at a held K = 0 whose own step beat K = 0, accepting more than the estimate said
# (an acceptance probe starting a chain: and at least the profile's AL(K)), is followed by
# another at the next choice, up to this many in a row: enough steps to end the default
# warm-up (16) at one go, and to move a forgetting-0.05 estimate most of the way to a
# returned acceptance.
FOLLOW_UPS = 15


def acceptance_probe(g_prior: np.ndarray, itl: np.ndarray, excess, one_plus_margin: float, interval: int):
    """(the K an acceptance probe runs at a held K = 0, the dispatches between two such
    probes, the K = 0 rounds it also waits for), per goodput row under the profile's
    acceptance `g_prior`, its ITL ([..., K]) and the measured probe excess (K = 0 steps,
    [...]: `LatencyModel.probe_excess`).

    The K is the best one there, or 0 (no probe) where it does not beat K = 0 by the
    hysteresis margin: there even live acceptance back at the profile's could not move
    the hold, so a probe would only cost (`bench_full_s7`: at B = 64 K = 1 was 2%
    ahead on the profile, and dynamic ran it in 2% of its steps). The interval is
    `interval` (`probe_interval`), or longer where a probe is dear for what it could win:
    a probe's extra time, ITL(B, K) / ITL(B, 0) - 1 K = 0 steps, is at most PROBE_SHARE of
    the time its K would save over the interval if the profile's acceptance came back,
    gain = G(K) / G(0) - 1 per step. At B = 1-4 that is the plain interval; at
    B = 16 and 64, where a K = 2 or 1 step costs 2.2x or 1.75x a K = 0 step for a 10%
    or 4% gain (`bench_full_s8`), 3x and 5x longer: there probes had cost dynamic
    3-6% of its time.

    What a probe really costs is more: its round also runs the draft's catch-up on every
    token committed since the draft last ran (one 32-token round of it is 0.15x a K = 0
    step at B = 1, 0.76x at B = 64). That excess is measured (`probe_excess`: what such
    rounds took beyond their K's step, in K = 0 steps), and the same rule counted in
    K = 0 rounds (time) gives the rounds a probe also waits for: extra + excess at most
    PROBE_SHARE of the gain over them, at most PROBE_COST_CAP times `every` (0 where
    that is no more than `every`: a dispatch holds a round or more). The catch-up grows
    with the rounds skipped, so the spacing settles where the share is met, or at the
    cap where even the catch-up alone exceeds it (probes never stop). The excess enters
    only here: not the goodput rows, nor whether a probe runs (learnt into the K's
    latency factor it priced the probes out, and K = 0 was held for good)."""
    best = np.argmax(g_prior, axis=-1)
    g_best = np.take_along_axis(g_prior, best[..., None], axis=-1)[..., 0]
    gain = g_best / g_prior[..., 0] - 1.0
    probe = gain > one_plus_margin - 1.0
    extra = np.take_along_axis(itl, best[..., None], axis=-1)[..., 0] / itl[..., 0] - 1.0
    safe_gain = np.where(probe, gain, 1.0)  # rows without a probe: any positive number
    every = np.maximum(np.where(probe, np.ceil(extra / (PROBE_SHARE * safe_gain)), 0), interval)
    rounds = np.minimum(np.ceil((extra + excess) / (PROBE_SHARE * safe_gain)), PROBE_COST_CAP * every)
    rounds = np.where(probe & (rounds > every), rounds, 0)
    return np.where(probe, best, 0), every.astype(int), rounds.astype(int)


def optimistic_probe(g_opt: np.ndarray, itl: np.ndarray, catchup_ms, one_plus_margin: float, interval: int):
    """(the K an optimistic probe runs at a held K = 0, the K = 0 rounds before it), per
    goodput row were every draft accepted `g_opt`, its ITL and the draft's catch-up on a
    row's context (ms; [..., K] and [...]).

    The probes at a held K = 0 only run where the profile's acceptance would move the
    hold, so a profile more pessimistic than the live drafts (a published curve, other
    prompts, a distilled draft) meant speculation was never tried: at B = 1, live
    acceptance 0.95 where K = 6 is 2.2x K = 0 ran K = 0 for good. This probe runs the
    cheapest K that beats K = 0 by the margin were every draft accepted (none where no
    K could: B = 64 on a typical profile), once so many K = 0 rounds have passed (and
    `interval` choices) that its extra time over K = 0, the catch-up included, is
    at most `OPTIMISTIC_SHARE` of theirs (and PROBE_SHARE of what it could win): the
    price of asking where acceptance is in fact low. Rounds, not choices: the bound is
    one of time, whatever the dispatches' lengths. A probe whose step beats K = 0 and
    accepts more than the estimate predicted is followed by others
    (`FOLLOW_UPS`), so live counts replace a pessimistic prior at once (a
    mixed batch under the makespan objective beat K = 0 on its mean row, as the estimate
    knew, and ran chains of 15 where the slowest row made K = 0 the choice)."""
    if g_opt.shape[-1] == 1:  # K = 0 only (a plain-decoding engine's profile): no probe
        none = np.zeros(g_opt.shape[:-1], int)
        return none, none
    beats = g_opt[..., 1:] > g_opt[..., :1] * one_plus_margin
    k = np.where(beats.any(axis=-1), beats.argmax(axis=-1) + 1, 0)
    kk = np.maximum(k, 1)[..., None]
    extra = (np.take_along_axis(itl, kk, axis=-1)[..., 0] + catchup_ms) / itl[..., 0] - 1.0
    gain = np.take_along_axis(g_opt, kk, axis=-1)[..., 0] / g_opt[..., 0] - 1.0
    safe_gain = np.where(k > 0, gain, 1.0)
    every = np.maximum(np.ceil(extra / OPTIMISTIC_SHARE), np.ceil(extra / (PROBE_SHARE * safe_gain)))
    return k, np.where(k > 0, np.maximum(every, interval), 0).astype(int)


def probe_plan(g_prior, g_opt, itl, excess, catchup_ms, one_plus_margin: float, interval: int):
    """(K, choices apart, K = 0 rounds apart, whether optimistic) of the probe at a held
    K = 0, per goodput row: the acceptance probe, else, where only perfect acceptance would
    move the hold, the optimistic one."""
    probe_k, every, rounds = acceptance_probe(g_prior, itl, excess, one_plus_margin, interval)
    opt_k, opt_every = optimistic_probe(g_opt, itl, catchup_ms, one_plus_margin, interval)
    optimistic = (probe_k == 0) & (opt_k > 0)
    return (np.where(optimistic, opt_k, probe_k), np.where(optimistic, opt_every, every),
            np.where(optimistic, 0, rounds), optimistic)


class Prober:
    """One controller's probe state and the choice of a probe's K at each dispatch.

    Args:
      interval: ``probe_interval``, choices between two probes at the least (0: none).
      one_plus_margin: 1 + the hysteresis margin.
      prior_al: the profile's AL(K), K = 0..: the bar an acceptance probe's step must reach
        to start a chain.
    """

    def __init__(self, interval: int, one_plus_margin: float, prior_al: np.ndarray | None):
        self.interval = interval
        self._one_plus_margin = one_plus_margin
        self.prior_al = prior_al  # the controller replaces it with its prior (`use_temperature`)
        self.count = 0  # steps chosen at another K than the held one
        self._since = 0  # choices since the last probe
        self.k0_rounds = 0  # K = 0 rounds observed since the last K > 0 round
        self._follow_up = False  # a probe's step at a held K = 0 beat K = 0: probe again next choice
        self._chain = 0  # follow-ups run since the probe that started them
        # the last probe at a held K = 0 is not observed yet: the AL its step must reach to be
        # followed up (besides beating K = 0 and the estimate), else None
        self._out: float | None = None

    def plan(self, g_prior, g_opt, itl, excess, catchup_ms):
        """`probe_plan` with this controller's margin and interval."""
        return probe_plan(g_prior, g_opt, itl, excess, catchup_ms, self._one_plus_margin, self.interval)

    def due(self) -> bool:
        """Counts a choice; whether a probe may run at it (its interval has passed, or a
        probe's step asked for a follow-up)."""
        if not self.interval:
            return False
        self._since += 1
        return self._since >= self.interval or self._follow_up

    def choose(self, cur: int, contender: Callable[[], int], k_prior: int, every: int,
               optimistic: bool = False, rounds: int = 0) -> int:
        """The K for a step at held K `cur` once `due()`: a `contender()` other than `cur`
        (a close K whose latency is still being learnt), else (holding K = 0) `k_prior` once
        `every` choices and `rounds` K = 0 rounds have passed (`acceptance_probe`; `every`
        K = 0 rounds for an `optimistic_probe`) or as a follow-up, else `cur`. A probe of
        `k_prior` is followed up (`observe`) when its step beats K = 0, accepting more than
        the estimate predicted and, for an acceptance probe that starts a chain, at least
        the profile's AL(K): its question is whether the profile's acceptance is back, and
        where it is, a probe an interval lifted the estimate over the hold in ~24 probes
        (B = 16: ~300 choices; chained ~50)."""
        follow = self._follow_up and cur == 0 and k_prior > 0
        self._follow_up = False
        if not follow and self._since < self.interval:
            return cur  # a follow-up was asked for, but the hold or the probe has changed
        k = cur if follow else contender()
        if k == cur and cur == 0:
            # an optimistic probe's interval counts rounds (its cost bound is in time)
            # (the round in flight is not observed yet: counted as one)
            if not follow and ((self.k0_rounds if optimistic else self._since) < every
                               or self.k0_rounds + 1 < rounds):
                if optimistic:
                    self._since = 0  # asked again `interval` choices on
                return cur  # no acceptance probe due yet at this batch size
            k = k_prior
        self._since = 0
        self._chain = self._chain + 1 if follow else 0
        self._out = None
        if cur == 0 and k == k_prior > 0:
            # an acceptance probe asks whether the profile's acceptance is back: at B = 1 a
            # step beats K = 0 with one draft of three accepted, 30% of the time at 0.3, so
            # a chain starts only where the profile's AL(K) is, and goes on while its steps
            # beat K = 0 (a return to 0.7 where the profile says 0.8 chains too)
            self._out = 0.0 if optimistic or follow else float(self.prior_al[min(k, len(self.prior_al) - 1)])
        if k != cur:
            self.count += 1
        return k

    def observe(self, k: int, al: float, beat_hold: Callable[[], bool]) -> None:
        """Records a finished round of `k` drafts whose rows accepted `al` tokens a row on
        average; a probe in flight is followed up when its step reached its bar and
        `beat_hold()` (the hold is still K = 0, its step beat K = 0, and the estimate did
        not see it coming)."""
        if k == 0:
            self.k0_rounds += 1
            return
        self.k0_rounds = 0
        if self._out is not None:
            bar, self._out = self._out, None
            self._follow_up = self._chain < FOLLOW_UPS and al >= bar and beat_hold()

    def may_come_next(self, rounds: int) -> bool:
        """Whether a rare probe due after `rounds` K = 0 rounds may run at the next choice,
        or one is in flight (its result may call for a follow-up)."""
        return self._follow_up or self._out is not None or (
            self._since + 1 >= self.interval and self.k0_rounds + 1 >= rounds)

    def end_run(self) -> None:
        """A probe chosen but never observed (a dropped dispatch) is no longer in flight."""
        self._out = None
        self._follow_up = False
