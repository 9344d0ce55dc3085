"""Host-side K controller (numpy only, no JAX): the policy.

Before each round the engine asks ``controller.choose_k(batch_size, ...)`` for the
number of drafts K, runs the (K, bucket) program, and reports the result with
``controller.observe(k, num_accepted, step_time_s)``.

Modes (``SpecConfig.controller_mode``): ``none`` (K = 0), ``static`` (K = max K),
``schedule`` (vLLM's per-batch-size ranges; uncovered batch sizes use K = 0) and
``goodput``::

    AL(K)  = 1 + sum_{i<=K} a_i          expected tokens per row per step
    K*(B)  = argmax_K  AL(K) / ITL(B, K)  ITL from the profile (ms per step)

The estimates this reads live elsewhere: ``a_i`` (profile during warm-up, then
live counts with forgetting; per request, shrunk toward the global estimate) in
`dsd_jax.acceptance`, ``ITL(B, K)`` (the profile at the batch and context bucket,
times a factor learnt per (batch bucket, K) from measured step times when
``dynamic.latency_forgetting`` > 0, as by default; not from the first K > 0 round
after K = 0 rounds, which also runs the draft's catch-up: what that costs beyond its
step is learnt apart, for the probes' spacing) in `dsd_jax.latency`. How well both predicted
each observed step (`calibration_log()`, the MAPEs in `stats()`) is kept by
`dsd_jax.calibration`.

Hysteresis: the controller starts at K = 0 and moves from its current K to the
best K only when the best K's predicted goodput is more than ``margin`` (relative)
above the current K's at this batch size.

Probes (`dsd_jax.probes`): K = 0 steps measure no acceptance, so while the controller
holds K = 0 every ``dynamic.probe_interval``-th choice (dispatch) may run another K: an
acceptance probe where the profile's acceptance would move the hold, spaced by what it
costs for what it could win; an optimistic one where only perfect acceptance would; none
where K = 0 wins even then. A probe whose step beats K = 0 is followed up, a choice apart.
Before those, with latency learning and ``dynamic.explore_gap`` > 0 (off by default), a
close contender whose latency is not learnt yet (`_contender`). A probe is observed like
any step; the held K changes only through the argmax.

Speed: the best K and the goodput row for every batch size 1..max_batch_size are
precomputed per context bucket, and rebuilt only when the acceptance estimate has
moved by more than ``refresh_tol`` since the last build (or the learnt latency
moved), so a call is a dict and a list lookup. ``per_request=True`` and the
makespan objective need the live request set, so each call there is a few
vectorised numpy operations on [B, K] arrays instead (tens of microseconds;
`benchmarks/controller_bench.py`).

Makespan objective (``dynamic.objective="makespan"``): when the caller passes each
live request's remaining token budget (`SpecEngine` does once no request is
queued), the goodput row becomes the progress of the request that finishes last::

    G(K) = 1 / max_r S_r(K)  /  ITL(B, K)

with S_r(K) the steps request r needs for its remaining tokens as the slowest of B
would (`RequestAcceptance.makespan_steps`): remaining_r / AL_r(K) from per-request
acceptance (tracked as in ``per_request``), plus z_B standard deviations (z_B = the
expected maximum of B standard normals) from each step's random token count and,
on rows with little data of their own, from the spread of acceptance learnt over
finished requests; drafts past what a row can still emit (K > remaining_r - 1) count
for nothing. Nothing refills the slots of such a batch, so it lasts as long
as its slowest request: the batch-mean AL over-rates K when rows accept unevenly
(one hard row then runs the tail alone: `benchmarks/straggler_tail.py`), and also
when they accept alike but by chance (at T=1, B=8, static K=3 ran 0.94x of K=0
where the mean AL said 1.06x: `benchmarks/draft_staleness.py`).

``disable_by_batch_size`` (K = 0 at the threshold and above, as vLLM V0) applies in every mode.
"""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from typing import Any, Hashable, Sequence

import numpy as np

from .acceptance import GlobalAcceptance, RequestAcceptance, al_curve, check_num_accepted, padded_prior
from .buckets import bucket_for
from .calibration import Calibration, step_ms
from .config import SpecConfig
from .latency import LatencyModel
from .probes import Prober
from .profile import Profile, ProfileMismatchWarning

__all__ = ["Controller"]

DEFAULT_FORGETTING = 0.05  # live-acceptance forgetting when no DynamicConfig is given


def _index(name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {v!r} ({type(v).__name__})") from None


def _check_buckets(batch_buckets: Sequence[int], max_batch_size: int) -> list[int]:
    bk = [_index("batch_buckets[]", b) for b in batch_buckets]
    if not bk or any(b < 1 for b in bk) or any(b2 <= b1 for b1, b2 in zip(bk, bk[1:])):
        raise ValueError(f"batch_buckets must be a non-empty strictly increasing list of ints >= 1, got {bk}")
    if bk[-1] < max_batch_size:
        raise ValueError(f"largest batch bucket {bk[-1]} < max_batch_size {max_batch_size}")
    return bk


def _load_profile(spec: SpecConfig, mode: str, profile: Profile | None) -> Profile | None:
    """The profile passed, else (goodput mode) the one at dynamic.profile; checked."""
    if mode == "goodput" and profile is None:
        if spec.dynamic.profile is None:
            raise ValueError(
                "goodput mode (SpecConfig.dynamic) needs a latency profile: set dynamic.profile to a "
                "profile JSON path or pass profile= to the Controller (run `dsd-jax profile` to make one)"
            )
        profile = Profile.load(spec.dynamic.profile)
    if profile is not None and not isinstance(profile, Profile):
        raise ValueError(f"profile must be a dsd_jax.profile.Profile, got {type(profile).__name__}")
    if profile is not None and mode != "none" and profile.method != spec.method:
        warnings.warn(
            f"profile was measured for method {profile.method!r} but SpecConfig.method is {spec.method!r}",
            ProfileMismatchWarning,
            stacklevel=3,  # the Controller's caller
        )
    return profile


class Controller:
    """Chooses K per step; see the module docstring.

    Args:
      spec: the `SpecConfig`.
      profile: a `Profile`. In goodput mode it is required; when None, the file at
        ``spec.dynamic.profile`` is loaded. In other modes it is optional: it calibrates
        (predicted vs measured step time) and, with batch_buckets, picks the bucket a
        batch runs in (`serving_bucket`: a larger one it shows faster at every K).
      max_batch_size: the engine's max live batch; the precomputed tables cover
        1..max_batch_size (larger values still work, on a slower path).
      batch_buckets: the engine's compiled batch buckets (sorted). When given, the
        step latency for a live batch n is the profile's ITL at the smallest
        bucket >= n (the program that actually runs), not the interpolation at n.
        Schedules and `disable_by_batch_size` always use the live n.
      refresh_tol: rebuild the precomputed tables when any a_i moved more than this.
      context_subdivisions: context-length buckets per profiled context interval
        (the ITL is evaluated at the nearest bucket; profiled points are exact).
      history: how many calibration records `calibration_log()` keeps.
    """

    def __init__(
        self,
        spec: SpecConfig,
        profile: Profile | None = None,
        max_batch_size: int = 64,
        *,
        batch_buckets: Sequence[int] | None = None,
        refresh_tol: float = 0.005,
        context_subdivisions: int = 8,
        history: int = 1024,
    ):
        if not isinstance(spec, SpecConfig):
            raise ValueError(f"spec must be a SpecConfig, got {type(spec).__name__}")
        self.spec = spec
        self.mode = spec.controller_mode
        self.max_k = spec.max_k
        self.max_batch_size = _index("max_batch_size", max_batch_size)
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if isinstance(refresh_tol, bool) or not isinstance(refresh_tol, numbers.Real) or not (
            0.0 <= float(refresh_tol) < 1.0
        ):
            raise ValueError(f"refresh_tol must be a number in [0, 1), got {refresh_tol!r}")
        self.refresh_tol = float(refresh_tol)
        subdiv = _index("context_subdivisions", context_subdivisions)
        if subdiv < 1:
            raise ValueError(f"context_subdivisions must be >= 1, got {subdiv}")
        self.profile = profile = _load_profile(spec, self.mode, profile)
        buckets = None if batch_buckets is None else _check_buckets(batch_buckets, self.max_batch_size)
        self._buckets = buckets
        self._init_policy(spec.dynamic)
        # Candidate Ks: 0..max_k restricted to the profile's ks (its ITL has no others).
        self._kc = self.max_k if profile is None else min(self.max_k, profile.max_k)
        self._latency = None  # no profile: no ITL predictions (calibration logs measured times only)
        if profile is not None:
            lat_forget = spec.dynamic.latency_forgetting if self.mode == "goodput" else 0.0
            self._latency = LatencyModel(profile, self.max_batch_size, self._kc + 1, buckets, subdiv, lat_forget)
        learning = self._latency is not None and self._latency.correction is not None
        self._explore_gap = spec.dynamic.explore_gap if learning else 0.0
        self._init_acceptance(spec.dynamic, profile)
        self._init_stats(history)
        # Precomputed tables per context bucket, per batch size: best K, goodput row, probe K,
        # probe interval, whether the probe is optimistic, the K = 0 rounds an acceptance probe
        # also waits for (`_build_table`).
        self._ktab: list[int] = []
        self._gtabs: dict[int, tuple[list, ...]] = {}
        if self.mode != "goodput":
            self._ktab = [spec.schedule_k(b) for b in range(self.max_batch_size + 1)]

    def _init_policy(self, dyn) -> None:
        goodput = dyn is not None and self.mode == "goodput"
        self._disable = self.spec.disable_by_batch_size
        self._per_request = bool(goodput and dyn.per_request)
        self._objective = dyn.objective if goodput else "throughput"
        self._track_rows = self._per_request or self._objective == "makespan"
        self._one_plus_margin = 1.0 + (dyn.margin if dyn is not None else 0.0)
        self._probe_interval = dyn.probe_interval if goodput else 0
        self._last_k = 0  # the K of the last observed round (the draft starts behind)
        self._cur = 0  # the K the hysteresis holds

    def _init_acceptance(self, dyn, profile: Profile | None) -> None:
        forgetting = dyn.forgetting if dyn is not None else DEFAULT_FORGETTING
        warmup = dyn.warmup_steps if (dyn is not None and self.mode == "goodput") else 0
        prior = padded_prior(None if profile is None else profile.acceptance, self.max_k)
        self._acc = GlobalAcceptance(prior, forgetting, warmup)
        self._requests = RequestAcceptance(self._acc)
        self._est_tables = self._acc.estimate.copy()  # the estimate the tables were built with
        self._prober = Prober(self._probe_interval, self._one_plus_margin, None)
        self._prior_curves(prior)
        self._perfect_al = np.arange(self._kc + 1, dtype=float) + 1.0  # every draft accepted

    def _prior_curves(self, prior: np.ndarray) -> None:
        self._prior_a = np.nan_to_num(prior)[: self._kc]  # for the probe K at a held K = 0
        self._prior_al = self._prober.prior_al = al_curve(self._prior_a, self._kc)

    def use_temperature(self, temperature: float) -> None:
        """The engine's call at the start of a run: the prior (what warm-up and draft positions
        few live rows reached fall back to) becomes the profile's acceptance at the measured
        temperature closest to the run's (`Profile.acceptance_for`); what was learnt live
        stays. Without acceptance measured at several temperatures nothing changes."""
        by_temperature = None if self.profile is None else self.profile.acceptance_by_temperature
        if not by_temperature or len(by_temperature) < 2:
            return
        prior = padded_prior(self.profile.acceptance_for(temperature), self.max_k)
        if np.array_equal(prior, self._acc.prior, equal_nan=True):
            return
        self._acc.use_prior(prior)
        self._prior_curves(prior)
        if self.mode == "goodput":
            self._est_tables = self._acc.estimate.copy()
            self._stale_tables()

    def _init_stats(self, history: int) -> None:
        self._history = _index("history", history)
        self.reset_counts()

    def reset_counts(self) -> None:
        """Zero what `stats()` counts (steps, K histograms, probes, refreshes,
        calibration errors). What the controller has learnt (acceptance estimate,
        latency factors, the held K) stays: a warm controller keeps choosing as before."""
        self._steps = 0
        self._k_counts = [0] * (self.max_k + 1)
        self._k_steps = [0] * (self.max_k + 1)
        self._refreshes = 0
        self._prober.count = 0
        self._calibration = Calibration(self._history)

    # ------------------------------------------------------------------ choose

    def choose_k(
        self,
        batch_size: int,
        context_len: int | None = None,
        request_ids: Sequence[Hashable] | None = None,
        remaining: Sequence[int] | None = None,
    ) -> int:
        """Number of drafts for the next round at this live batch size.

        `context_len` (goodput mode, profiles with a context axis) selects the ITL
        at that context length; None uses the profile's first context length.
        `request_ids` (per_request mode and the makespan objective) are the live
        requests, one per row: under data parallelism every shard's, while `batch_size`
        (whose step time the ITL gives) is the fullest shard's rows. `remaining`
        (makespan objective, with `request_ids`): how many tokens each of them may still
        produce; pass it only when nothing will refill the batch's slots (no queued
        requests).
        """
        if self.mode != "goodput":
            if type(batch_size) is int and 0 <= batch_size <= self.max_batch_size:
                k = self._ktab[batch_size]
            else:
                b = _index("batch_size", batch_size)
                k = 0 if b <= 0 else self.spec.schedule_k(b)
            self._k_counts[k] += 1
            return k
        if remaining is not None and request_ids is not None and self._objective == "makespan":
            return self._choose_makespan(batch_size, context_len, request_ids, remaining)
        if self._per_request and request_ids is not None:
            return self._choose_per_request(batch_size, context_len, request_ids)
        key = 0 if context_len is None else self._latency.cached_context_key(context_len)
        tab = self._gtabs.get(key)
        if tab is None:
            tab = self._build_table(key)
        if type(batch_size) is int and 0 < batch_size <= self.max_batch_size:
            # the hot path: hysteresis and probe on the precomputed rows
            self._cur = cur = self._hold(tab[0][batch_size], tab[1][batch_size], self._cur)
            if self._prober.due():
                g = tab[1][batch_size]
                cur = self._prober.choose(cur, lambda: self._contender(cur, batch_size, g), tab[2][batch_size],
                                          tab[3][batch_size], tab[4][batch_size], tab[5][batch_size])
            self._k_counts[cur] += 1
            return cur
        b = _index("batch_size", batch_size)
        if b <= 0:
            self._k_counts[0] += 1
            return 0
        return self._decide(b, key, self._al_vector())

    def _decide(self, b: int, key: int, al: np.ndarray, al_at=None) -> int:
        """`choose_k`'s hysteresis and probe on a goodput row computed now from `al`;
        `al_at(a)` (default: the mean row's AL curve) is the row were a_1..a_K = `a`, for the
        probes at a held K = 0: under the profile's acceptance, else every draft accepted."""
        g = self._goodput_row(b, key, al)
        self._cur = cur = self._hold(int(np.argmax(g)), g, self._cur)
        if self._prober.due():
            k_prior, every, rounds, optimistic = 0, self._probe_interval, 0, False
            if cur == 0:
                g_prior = self._goodput_row(b, key, self._prior_al if al_at is None else al_at(self._prior_a))
                g_opt = self._goodput_row(b, key, self._perfect_al if al_at is None else al_at(np.ones(self._kc)))
                k_prior, every, rounds, optimistic = (x.item() for x in self._prober.plan(
                    g_prior, g_opt, self._latency.itl(b, key), self._latency.probe_excess(b),
                    self._latency.catchup_ms(b, key)))
            cur = self._prober.choose(cur, lambda: self._contender(cur, b, g), k_prior, every, optimistic, rounds)
        self._k_counts[cur] += 1
        return cur

    def _hold(self, best: int, g, cur: int) -> int:
        """The hysteresis: move from the held K `cur` to the goodput row `g`'s `best` only
        when it is ahead by more than the margin."""
        return best if best != cur and g[best] > g[cur] * self._one_plus_margin else cur

    def _contender(self, cur: int, b: int, g) -> int:
        """The least observed K != cur with goodput g[K] >= (1 - explore_gap) g[cur]
        whose latency is not learnt yet (cur itself when there is none)."""
        if not self._explore_gap:
            return cur
        floor = g[cur] * (1.0 - self._explore_gap)
        best, fewest = cur, self._latency.learnt_weight
        for k, (gk, w) in enumerate(zip(g, self._latency.weights(b))):
            if k != cur and gk > 0 and gk >= floor and w < fewest:
                best, fewest = k, w
        return best

    def _live_rows(self, batch_size, context_len, request_ids):
        """(b, context key, per-request rows), or None for an empty batch."""
        b = _index("batch_size", batch_size)
        if b <= 0:
            return None
        if len(request_ids) < b:  # more under data parallelism: b is the fullest shard's rows
            raise ValueError(f"request_ids has {len(request_ids)} entries but batch_size is {b}")
        key = 0 if context_len is None else self._latency.cached_context_key(context_len)
        return b, key, self._requests.rows_for(request_ids)

    def _choose_makespan(self, batch_size, context_len, request_ids, remaining) -> int:
        row = self._makespan_row(batch_size, context_len, request_ids, remaining)
        if row is None:
            self._k_counts[0] += 1
            return 0
        b, key, al, at = row
        return self._decide(b, key, al, at)

    def _makespan_row(self, batch_size, context_len, request_ids, remaining):
        """(b, context key, the AL row of the makespan objective, the same as a function of
        the rows' a_1..a_K), or None for an empty batch. Registers the live rows."""
        # checked before the live rows are registered, so a refused call leaves no state
        try:
            rem = np.asarray(remaining, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"remaining must be a sequence of numbers, got {remaining!r}") from None
        if rem.shape != (len(request_ids),):
            raise ValueError(f"remaining has shape {rem.shape} but there are {len(request_ids)} request_ids")
        if not np.all(np.isfinite(rem)):
            raise ValueError("remaining must hold finite numbers")
        live = self._live_rows(batch_size, context_len, request_ids)
        if live is None:
            return None
        b, key, rows = live
        # The steps until the last row is done; a row about to finish is never critical
        # (the engine's token counts lag one step behind).
        rem = np.maximum(rem, 1.0)
        # A step emits at most K + 1 of a row's tokens, so drafts past its R - 1 are wasted
        # (the engine's R still counts the tokens in flight: never fewer than are left): such
        # a K takes K = R - 1's steps, and its dearer ITL loses (at R = 1 K = 6 had run).
        upto = np.minimum(np.arange(self._kc + 1), np.ceil(rem)[:, None] - 1).astype(np.intp)
        rows_index = np.arange(len(rows))[:, None]

        def steps_at(acceptance=None):
            steps = self._requests.makespan_steps(rows, rem, self._kc, len(rows), acceptance=acceptance)
            return steps[rows_index, upto]

        # A probe at a held K = 0 asks whether the profile's acceptance is back, so it is
        # priced under this objective too: the slowest of B rows accepting at the profile's
        # rates, with the spread learnt between requests. (Priced by the mean row, probes
        # at B = 16 ran K = 2 and caught 16 rows' drafts up where no acceptance could
        # move the hold: 5% of dynamic's time there, `benchmarks/results/makespan_probes/`.)
        def at(acceptance):
            return 1.0 / steps_at(acceptance).max(axis=0)

        return b, key, at(None), at

    def _choose_per_request(self, batch_size, context_len, request_ids) -> int:
        live = self._live_rows(batch_size, context_len, request_ids)
        if live is None:
            self._k_counts[0] += 1
            return 0
        b, key, rows = live
        return self._decide(b, key, self._row_al(rows).sum(axis=0))

    def _row_al(self, rows) -> np.ndarray:
        """AL_r(K) for K = 0.._kc per request row ([rows, _kc + 1])."""
        return al_curve(self._requests.estimate(rows, self._kc), self._kc)

    # ------------------------------------------------------------------ goodput tables

    def _al_vector(self) -> np.ndarray:
        """AL(K) for K = 0.._kc from the acceptance estimate the tables were built with."""
        return al_curve(self._est_tables, self._kc)

    def _goodput_row(self, b: int, key: int, al: np.ndarray) -> np.ndarray:
        g = al / self._latency.itl(b, key)
        if self._disable is not None and b >= self._disable:
            g[1:] = 0.0
        return g

    def _build_table(self, key: int):
        itl = self._latency.itl_rows(key)
        g = self._al_vector()[None, :] / itl
        g_prior = self._prior_al[None, :] / itl
        g_opt = self._perfect_al[None, :] / itl
        if self._disable is not None and self._disable <= self.max_batch_size:
            g[self._disable :, 1:] = 0.0
            g_prior[self._disable :, 1:] = 0.0
            g_opt[self._disable :, 1:] = 0.0
        # (best K, goodput row, the probe K at a held K = 0, the dispatches between such
        # probes, whether that probe is an optimistic one, the K = 0 rounds an acceptance
        # probe also waits for at its measured cost)
        probe_k, every, rounds, optimistic = self._prober.plan(
            g_prior, g_opt, itl, self._latency.probe_excess_rows(), self._latency.catchup_rows(key))
        tab = (np.argmax(g, axis=1).tolist(), g.tolist(), probe_k.tolist(), every.tolist(), optimistic.tolist(),
               rounds.tolist())
        self._gtabs[key] = tab
        return tab

    def serving_bucket(self, batch_size: int) -> int | None:
        """The compiled batch bucket a live batch of `batch_size` rows runs in, the one whose
        ITL priced its K: the smallest that holds it, or a larger one the profile shows
        faster at every context and K (`LatencyModel.serving`). The engine dispatches it.
        None for a controller built without the engine's batch_buckets."""
        if self._buckets is None:
            return None
        b = _index("batch_size", batch_size)
        if not 1 <= b <= self._buckets[-1]:
            raise ValueError(f"batch_size must be in 1..{self._buckets[-1]}, got {b}")
        return bucket_for(b, self._buckets) if self._latency is None else self._latency.bucket(b)

    def context_bucket(self, context_len: float | None) -> float:
        """The context length whose ITL the controller uses for `context_len`."""
        if self.profile is None:
            raise ValueError("context_bucket needs a profile")
        lat = self._latency
        return lat.context_value(0 if context_len is None else lat.context_key(context_len))

    def predicted_goodput(self, batch_size: int, context_len: float | None = None) -> np.ndarray:
        """Goodput AL(K) / ITL(B, K) (tokens/ms/row) for K = 0..max candidate, as used by
        `choose_k` (the tables' acceptance estimate, bucketed context, disable rule)."""
        if self.profile is None or self.mode == "none":
            raise ValueError("predicted_goodput needs goodput mode (or a profile)")
        b = _index("batch_size", batch_size)
        if b < 1:
            raise ValueError(f"batch_size must be >= 1, got {b}")
        key = 0 if context_len is None else self._latency.context_key(context_len)
        return self._goodput_row(b, key, self._al_vector())

    def held_k(self, batch_size: int, context_len: float | None = None,
               request_ids: Sequence[Hashable] | None = None, remaining: Sequence[int] | None = None) -> int:
        """The K `choose_k` would run at this batch size now, hysteresis applied, without
        probing or counting a choice: whether admission should prefill the drafter. (The
        goodput row's bare argmax says "speculate" where K wins by less than `margin`,
        while `choose_k` keeps holding K = 0 and the prefill is wasted.) `request_ids` and
        `remaining` as for `choose_k`: under the makespan objective the row is the slowest
        live row's, as `choose_k` will decide (registering the requests' rows); the batch
        mean's row would prefill the drafter for 64 rows where the makespan holds K = 0.
        Per request (`per_request`, with `request_ids`), the sum of the requests' own rows:
        after a hard request the global rates hold K = 0 where a fresh one's speculate."""
        if self.mode == "goodput" and self._objective == "makespan" and None not in (request_ids, remaining):
            row = self._makespan_row(batch_size, context_len, request_ids, remaining)
            if row is None:
                return 0
            b, key, al, _ = row
            g = self._goodput_row(b, key, al)
        elif self.mode == "goodput" and self._per_request and request_ids is not None:
            live = self._live_rows(batch_size, context_len, request_ids)
            if live is None:
                return 0
            b, key, rows = live
            g = self._goodput_row(b, key, self._row_al(rows).sum(axis=0))
        else:
            g = self.predicted_goodput(batch_size, context_len)
        return self._hold(int(np.argmax(g)), g, self._cur)

    def settled(self, batch_size: int, k: int, context_len: float | None = None) -> bool:
        """Whether `choose_k` is sure to go on choosing `k` at this batch size until the
        batch changes: the K of every mode but goodput follows the batch size alone, and a
        goodput controller holding K = 0 where it runs no probe (no acceptance probe: even
        the profile's acceptance would not move the hold; no latency contender to explore)
        has nothing to learn from, unless its goodput row is per request (per-request mode;
        the makespan objective, whose row also moves as the requests' remaining budgets
        shrink). K = 0 steps still train K = 0's latency factor under latency learning,
        but that average moves by `latency_forgetting` a step, so a hold it could undo is
        asked again after the dispatch's rounds all the same. Where only an optimistic
        probe may come (rare, due after so many K = 0 rounds, so longer dispatches make it
        no dearer) the hold is settled too, except at the choice before it may come due and
        while one is in flight or a follow-up is due. The engine lets such a
        choice run up to `step.MAX_ROUNDS` rounds a dispatch (32, not 8): dynamic at K = 0
        then dispatches as plain decoding does."""
        if self.mode != "goodput":
            return True
        b = _index("batch_size", batch_size)
        if k != 0 or self._cur != 0 or not 0 < b <= self.max_batch_size:
            return False
        if self._track_rows:
            return False  # rows of their own (makespan: their budgets shrink)
        key = 0 if context_len is None else self._latency.cached_context_key(context_len)
        tab = self._gtabs.get(key) or self._build_table(key)
        if self._hold(tab[0][b], tab[1][b], 0) != 0:
            return False  # the goodput row already beats the hold: it moves next choice
        if not self._probe_interval:
            return True
        if self._contender(0, b, tab[1][b]) != 0 or (tab[2][b] and not tab[4][b]):
            return False
        # An optimistic probe is rare and due after so many K = 0 rounds, so longer
        # dispatches make it no dearer: settled unless it may come at the next choice, or
        # one is in flight (its result may call for a follow-up).
        return not tab[2][b] or not self._prober.may_come_next(tab[3][b])

    def end_run(self) -> None:
        """Called by the engine when a run ends: a probe chosen but never observed (the
        engine drops the dispatch launched behind the batch's last rows, and an abandoned
        stream's) is no longer outstanding, so `settled` does not wait for it and the next
        run's first K > 0 round is not judged as its follow-up."""
        self._prober.end_run()

    # ------------------------------------------------------------------ per-request state

    def forget_request(self, rid: Hashable, finished: bool = True) -> None:
        """Drop a request's per-request acceptance (no-op if unknown); only a finished one
        informs the spread between requests (the engine passes finished=False for the
        unfinished requests of an abandoned or failed run)."""
        self._requests.forget(rid, finished)

    def request_acceptance(self, rid: Hashable) -> np.ndarray | None:
        """A request's own acceptance estimate (per_request mode or the makespan
        objective), or None if unseen."""
        return self._requests.request(rid)

    # ------------------------------------------------------------------ observe

    def observe(
        self,
        k: int,
        num_accepted,
        step_time_s: float | None = None,
        request_ids: Sequence[Hashable] | None = None,
        context_len: float | None = None,
        batch_size: int | None = None,
    ) -> None:
        """Record one finished round that ran with `k` drafts.

        num_accepted[r]: drafts accepted in live row r (0..k); draft position i <= k
            counts as accepted iff num_accepted[r] >= i, and as proposed always.
        step_time_s: measured wall time of the round; with a profile, the predicted
            ITL is compared to it (`stats()['itl_mape']`).
        request_ids: one id per row (per_request mode and the makespan objective update
            each request's estimate).
        context_len: the context length the round ran at (for the ITL prediction).
        batch_size: the batch the round's time belongs to (default: the rows given); under
            data parallelism, the fullest data shard's rows.
        """
        k = _index("k", k)
        if not 0 <= k <= self.max_k:
            raise ValueError(f"k must be in 0..{self.max_k}, got {k}")
        acc = check_num_accepted(k, num_accepted)
        b = int(acc.size)
        if request_ids is not None and len(request_ids) != b:
            raise ValueError(f"request_ids has {len(request_ids)} entries but num_accepted has {b}")
        meas_ms = step_ms(step_time_s)

        self._steps += 1
        self._k_steps[k] += 1
        if b == 0:
            return
        # The first K > 0 round after K = 0 rounds also runs the draft's catch-up on the
        # tokens it skipped (`dsd_jax.step`): a one-off, not what each round at that K costs.
        # Learnt into the (bucket, K) factor it priced the probes at a held K = 0 out for good.
        catching_up, self._last_k = k > 0 and self._last_k == 0, k
        rows = self._requests.rows_for(request_ids) if self._track_rows and request_ids is not None else None
        # Calibration scores the predictions made for this step, before it updates them.
        pred_al = None if k == 0 else self._step_al(k, acc, rows)
        timed_b = b if batch_size is None else _index("batch_size", batch_size)
        itl_ms = None if meas_ms is None else self._step_itl(k, timed_b, meas_ms, context_len, not catching_up)
        if catching_up and itl_ms is not None and self._latency.learn_probe(timed_b, k, meas_ms, context_len):
            self._stale_tables()  # the acceptance probes' spacing moved
        self._calibration.record(self._steps, k, acc, pred_al, meas_ms, itl_ms)
        al = 1.0 + int(acc.sum()) / b  # acc.mean()'s value, without its overhead
        # a probe's step that beat K = 0, and the estimate did not see it coming: ask again
        self._prober.observe(k, al, lambda: self._cur == 0 and self._beat_k0(k, acc, timed_b, context_len)
                             and al > pred_al * self._one_plus_margin)
        if k == 0:
            return
        self._acc.observe(k, acc)
        if rows is not None:
            self._requests.observe(rows, acc, k)
        if self.mode == "goodput" and self._kc > 0:
            est = self._acc.estimate
            if np.abs(est[: self._kc] - self._est_tables[: self._kc]).max() > self.refresh_tol:
                self._est_tables = est.copy()
                self._stale_tables()

    def _beat_k0(self, k: int, acc: np.ndarray, b: int, context_len) -> bool:
        """Whether a step of `k` drafts that accepted `acc` made more tokens a row per
        predicted ms than K = 0 would, by more than the margin."""
        pk, p0 = (self._latency.predict_ms(b, x, context_len) for x in (k, 0))
        return pk is not None and (1.0 + float(acc.mean())) * p0[1] > pk[1] * self._one_plus_margin

    def _step_al(self, k: int, acc: np.ndarray, rows) -> float:
        """The AL predicted for a step of `k` drafts: the rows' own estimates when tracked."""
        if rows is None:
            return self._acc.al[k]
        return 1.0 + float(self._requests.estimate(rows, k).sum()) / acc.size

    def _step_itl(self, k: int, b: int, meas_ms: float, context_len, learn: bool = True):
        """The (profile, predicted) ITL in ms for a step that took `meas_ms` (None without
        a profile), taken before the measurement trains the latency factors (if `learn`)."""
        pred = None if self._latency is None else self._latency.predict_ms(b, k, context_len)
        if pred is not None and learn and self._latency.learn(b, k, meas_ms, pred[0]):
            self._stale_tables()
        return pred

    def _stale_tables(self) -> None:
        """Drops the precomputed tables: the estimate or the ITLs they were built from moved."""
        self._gtabs.clear()
        self._refreshes += 1

    # ------------------------------------------------------------------ reporting

    def acceptance_estimate(self) -> np.ndarray:
        """Current a_1..a_max_k (profile during warm-up, then live; NaN = no data)."""
        return self._acc.estimate.copy()

    @property
    def objective(self) -> str:
        """"makespan" when `choose_k` uses the remaining budgets it is given, else "throughput"."""
        return self._objective

    @property
    def current_k(self) -> int:
        """The K the hysteresis currently holds (goodput mode)."""
        return self._cur

    @property
    def using_live_acceptance(self) -> bool:
        return bool(self._acc.live)

    def predicted_al(self, k: int) -> float:
        """AL(k) = 1 + sum_{i<=k} a_i from the current estimate."""
        k = _index("k", k)
        if not 0 <= k <= self.max_k:
            raise ValueError(f"k must be in 0..{self.max_k}, got {k}")
        return self._acc.al[k]

    def calibration_log(self) -> list[dict]:
        """Recent per-step records: k, batch_size, pred/meas AL and ITL (ms)."""
        return self._calibration.log()

    def stats(self) -> dict:
        """mode, steps_observed, acceptance, itl_mape / al_mape (percent, None without
        data; ITL predictions include the learnt latency factors), k_choices (choose_k
        results) and k_steps (observed ks) histograms, probes (steps run at another K
        than the held one), latency_factors ({batch bucket: factor per K} for the
        buckets with measured steps) and probe_excess ({batch bucket: what a first K > 0
        round after K = 0 rounds took beyond its step, in K = 0 steps}; it spaces the
        acceptance probes)."""
        return {
            "mode": self.mode,
            "steps_observed": self._steps,
            "spec_steps_observed": sum(self._k_steps[1:]),  # since reset_counts, as the rest
            "using_live_acceptance": self.using_live_acceptance,
            "acceptance": [None if math.isnan(x) else float(x) for x in self._acc.estimate],
            **self._calibration.mape(),
            "k_choices": {k: c for k, c in enumerate(self._k_counts)},
            "k_steps": {k: c for k, c in enumerate(self._k_steps)},
            "current_k": self._cur,
            "table_refreshes": self._refreshes,
            "probes": self._prober.count,
            "latency_factors": self._latency.observed() if self._latency is not None else {},
            "probe_excess": self._latency.observed_probe_excess() if self._latency is not None else {},
        }
