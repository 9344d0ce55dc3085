"""Host-side K controller (numpy only, no JAX).

Before each round the engine asks ``controller.choose_k(batch_size, ...)`` for the
number of drafts K, runs the (K, bucket) program, and reports the result with
``controller.observe(k, num_accepted, step_time_s)``.

Modes (``SpecConfig.controller_mode``): ``none`` (K = 0), ``static`` (K = max K),
``schedule`` (vLLM's per-batch-size ranges; uncovered batch sizes use K = 0) and
``goodput``::

    AL(K)  = 1 + sum_{i<=K} a_i          expected tokens per row per step
    K*(B)  = argmax_K  AL(K) / ITL(B, K)  ITL from the profile (ms per step)

``a_i`` = P(draft position i accepted), unconditional (= P(num_accepted >= i)).
It comes from the profile until ``dynamic.warmup_steps`` steps with K > 0 have been
observed, then from live per-position counts with exponential forgetting
(discounted counts: each step's counts are added after multiplying the history by
``1 - forgetting``; at a steady batch size the newest step weighs ``forgetting``).
Positions the live data has not covered yet (K never reached them) are
extrapolated from the profile's shape, and the estimate is kept non-increasing.

Hysteresis: the controller starts at K = 0 and moves from its current K to the
best K only when the best K's predicted goodput is more than ``margin`` (relative)
above the current K's at this batch size.

Latency learning (``dynamic.latency_forgetting`` > 0; off by default):
``ITL(B, K)`` is the profile's times a factor learnt from the measured step times,
per (batch bucket, K) (`dsd_jax.latency`), so a profile cell timed wrong, or a
machine that changed since, stops steering the choice.

Probes: every ``dynamic.probe_interval``-th step runs another K than the held one.
K = 0 steps measure no acceptance, so a K = 0 decision taken on a bad stretch of
live acceptance could never be revised: while the controller holds K = 0 at a
batch size where the profile's acceptance would speculate, the probe runs the
profile's best K there. Before that (with latency learning on), a probe runs
the least observed K whose predicted goodput is within ``dynamic.explore_gap`` of
the held K's and whose latency at this batch bucket is not learnt yet, so close
contenders get measured a few times, not only the winner. A probe is observed
like any step; the held K changes only through the argmax.

Speed: the best K and the goodput row for every batch size 1..max_batch_size are
precomputed per context bucket, and rebuilt only when the acceptance estimate has
moved by more than ``refresh_tol`` since the last build, so a call is a dict and a
list lookup. ``per_request=True`` and the makespan objective need the live request
set, so each call there is a few vectorised numpy operations on [B, K] arrays
instead (tens of microseconds; `benchmarks/controller_bench.py`).

Makespan objective (``dynamic.objective="makespan"``): when the caller passes each
live request's remaining token budget (`SpecEngine` does once no request is
queued), the goodput row becomes the critical request's progress::

    G(K) = min_r AL_r(K) / remaining_r  /  ITL(B, K)

with AL_r from per-request acceptance (tracked as in ``per_request``). Nothing
refills the slots of such a batch, so it lasts as long as its slowest request;
the batch-mean AL over-rates K when rows accept unevenly (one hard row then runs
the tail alone: `benchmarks/straggler_tail.py`).

``disable_by_batch_size`` (K = 0 above the threshold) applies in every mode.
"""

from __future__ import annotations

import bisect
import collections
import math
import numbers
import operator
import warnings
from typing import Any, Hashable, Sequence

import numpy as np

from .config import SpecConfig
from .latency import LatencyCorrection
from .profile import Profile, ProfileMismatchWarning

__all__ = ["Controller"]

_CTX_CACHE_LIMIT = 1 << 16
LATENCY_REFRESH_TOL = 0.01  # rebuild the tables when a latency factor moved by more than 1%
DEFAULT_FORGETTING = 0.05  # live-acceptance forgetting when no DynamicConfig is given
ROW_PRIOR_STEPS = 4  # weight of the global estimate in each request's own estimate, in steps


def _index(name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {v!r} ({type(v).__name__})") from None


class Controller:
    """Chooses K per step; see the module docstring.

    Args:
      spec: the `SpecConfig`.
      profile: a `Profile`. In goodput mode it is required; when None, the file at
        ``spec.dynamic.profile`` is loaded. In other modes it is optional and only
        used for calibration (predicted vs measured step time).
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
        self._subdiv = _index("context_subdivisions", context_subdivisions)
        if self._subdiv < 1:
            raise ValueError(f"context_subdivisions must be >= 1, got {self._subdiv}")

        dyn = spec.dynamic
        if self.mode == "goodput" and profile is None:
            if dyn.profile is None:
                raise ValueError(
                    "goodput mode (SpecConfig.dynamic) needs a latency profile: set dynamic.profile to a "
                    "profile JSON path or pass profile= to the Controller (run `dsd-jax profile` to make one)"
                )
            profile = Profile.load(dyn.profile)
        if profile is not None and not isinstance(profile, Profile):
            raise ValueError(f"profile must be a dsd_jax.profile.Profile, got {type(profile).__name__}")
        self.profile = profile
        if profile is not None and self.mode != "none" and profile.method != spec.method:
            warnings.warn(
                f"profile was measured for method {profile.method!r} but SpecConfig.method is {spec.method!r}",
                ProfileMismatchWarning,
                stacklevel=2,
            )

        self._buckets: list[int] | None = None
        if batch_buckets is not None:
            bk = [_index("batch_buckets[]", b) for b in batch_buckets]
            if not bk or any(b < 1 for b in bk) or any(b2 <= b1 for b1, b2 in zip(bk, bk[1:])):
                raise ValueError(f"batch_buckets must be a non-empty strictly increasing list of ints >= 1, got {bk}")
            if bk[-1] < self.max_batch_size:
                raise ValueError(f"largest batch bucket {bk[-1]} < max_batch_size {self.max_batch_size}")
            self._buckets = bk

        self._disable = spec.disable_by_batch_size
        self._per_request = bool(dyn is not None and dyn.per_request and self.mode == "goodput")
        self._objective = dyn.objective if (dyn is not None and self.mode == "goodput") else "throughput"
        self._track_rows = self._per_request or self._objective == "makespan"
        self._forget = dyn.forgetting if dyn is not None else DEFAULT_FORGETTING
        self._keep = 1.0 - self._forget
        self._warmup = dyn.warmup_steps if (dyn is not None and self.mode == "goodput") else 0
        self._one_plus_margin = 1.0 + (dyn.margin if dyn is not None else 0.0)
        self._probe_interval = dyn.probe_interval if (dyn is not None and self.mode == "goodput") else 0
        self._since_probe = 0  # choices since the last probe
        self._probes = 0

        # Candidate Ks: 0..max_k restricted to the profile's ks (goodput mode).
        mk = self.max_k
        if self.mode == "goodput":
            mk = min(mk, profile.max_k)
        self._kc = mk  # largest candidate K
        self._latency = None
        if self.mode == "goodput" and dyn.latency_forgetting > 0:
            buckets = self._buckets or range(1, self.max_batch_size + 1)
            self._latency = LatencyCorrection(buckets, mk + 1, dyn.latency_forgetting)
        self._explore_gap = dyn.explore_gap if self._latency is not None else 0.0
        self._lat_tables = None  # the log factors the current tables were built with
        # Prior acceptance (profile), padded with NaN to max_k.
        prior = np.full(self.max_k, np.nan)
        if profile is not None and self.max_k > 0:
            n = min(self.max_k, profile.max_k)
            prior[:n] = profile.acceptance[:n]
        self._prior = prior
        self._prior_al = np.ones(self._kc + 1)
        self._prior_al[1:] += np.cumsum(np.nan_to_num(prior[: self._kc]))
        # Live discounted counts per draft position 1..max_k.
        self._A = np.zeros(self.max_k)
        self._N = np.zeros(self.max_k)
        self._positions = np.arange(1, self.max_k + 1)
        self._kseen = 0  # live data covers draft positions 1.._kseen
        self._steps = 0
        self._spec_steps = 0
        self._set_estimate(self._compute_estimate())
        self._est_tables = self._est.copy()
        self._refreshes = 0

        # Hysteresis state and statistics.
        self._cur = 0
        self._k_counts = [0] * (self.max_k + 1)
        self._k_steps = [0] * (self.max_k + 1)
        self._itl_err_sum = 0.0
        self._itl_n = 0
        self._al_err_sum = 0.0
        self._al_n = 0
        self._log: collections.deque = collections.deque(maxlen=max(1, _index("history", history)))

        # Per-request acceptance (per_request mode, makespan objective).
        self._rows: dict[Hashable, int] = {}
        self._free: list[int] = []
        # Discounted accepted / proposed counts per request row and draft position.
        self._Ar = np.zeros((0, self.max_k))
        self._Nr = np.zeros((0, self.max_k))

        # Precomputed tables.
        self._ktab: list[int] = []
        self._gtabs: dict[int, tuple[list[int], list[list[float]]]] = {}
        self._itl_cache: dict[int, np.ndarray] = {}
        self._ckey_cache: dict[Any, int] = {}
        if self.mode != "goodput":
            self._ktab = [spec.schedule_k(b) for b in range(self.max_batch_size + 1)]

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
        requests, one per row. `remaining` (makespan objective, with `request_ids`):
        how many tokens each of them may still produce; pass it only when nothing
        will refill the batch's slots (no queued requests).
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
        key = 0 if context_len is None else self._ckey_cache.get(context_len)
        if key is None:
            key = self._context_key(context_len)
        tab = self._gtabs.get(key)
        if tab is None:
            tab = self._build_table(key)
        if type(batch_size) is int and 0 < batch_size <= self.max_batch_size:
            best = tab[0][batch_size]
            cur = self._cur
            if best != cur:
                g = tab[1][batch_size]
                if g[best] > g[cur] * self._one_plus_margin:
                    self._cur = cur = best
            if self._probe_interval:
                self._since_probe += 1
                if self._since_probe >= self._probe_interval:
                    cur = self._probe(cur, batch_size, tab[1][batch_size], tab[2][batch_size])
            self._k_counts[cur] += 1
            return cur
        b = _index("batch_size", batch_size)
        if b <= 0:
            self._k_counts[0] += 1
            return 0
        return self._decide(b, key, self._al_vector())

    def _decide(self, b: int, key: int, al: np.ndarray) -> int:
        g = self._goodput_row(b, key, al)
        best = int(np.argmax(g))
        cur = self._cur
        if best != cur and g[best] > g[cur] * self._one_plus_margin:
            self._cur = cur = best
        if self._probe_interval:
            self._since_probe += 1
            if self._since_probe >= self._probe_interval:
                k_prior = int(np.argmax(self._goodput_row(b, key, self._prior_al))) if cur == 0 else 0
                cur = self._probe(cur, b, g, k_prior)
        self._k_counts[cur] += 1
        return cur

    def _probe(self, cur: int, b: int, g, k_prior: int) -> int:
        """The K for a probe step at held K `cur`: a close contender whose latency is
        still being learnt, else (holding K = 0) the profile acceptance's best K."""
        self._since_probe = 0
        k = self._contender(cur, b, g)
        if k == cur and cur == 0:
            k = k_prior
        if k != cur:
            self._probes += 1
        return k

    def _contender(self, cur: int, b: int, g) -> int:
        """The least observed K != cur with goodput g[K] >= (1 - explore_gap) g[cur]
        whose latency is not learnt yet (cur itself when there is none)."""
        if not self._explore_gap:
            return cur
        floor = g[cur] * (1.0 - self._explore_gap)
        best, fewest = cur, self._latency.learnt_weight
        for k, (gk, w) in enumerate(zip(g, self._latency.weights(self._bucket(b)))):
            if k != cur and gk > 0 and gk >= floor and w < fewest:
                best, fewest = k, w
        return best

    def _live_rows(self, batch_size, context_len, request_ids):
        """(b, context key, per-request rows), or None for an empty batch (K = 0)."""
        b = _index("batch_size", batch_size)
        if b <= 0:
            self._k_counts[0] += 1
            return None
        if len(request_ids) != b:
            raise ValueError(f"request_ids has {len(request_ids)} entries but batch_size is {b}")
        key = 0 if context_len is None else self._ckey_cache.get(context_len)
        if key is None:
            key = self._context_key(context_len)
        return b, key, self._rows_for(request_ids)

    def _choose_makespan(self, batch_size, context_len, request_ids, remaining) -> int:
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
            return 0
        b, key, rows = live
        # The critical row's share of its remaining work done per step; a row about to
        # finish is never critical (the engine's token counts lag one step behind).
        progress = (self._row_al(rows) / np.maximum(rem, 1.0)[:, None]).min(axis=0)
        return self._decide(b, key, progress)

    def _choose_per_request(self, batch_size, context_len, request_ids) -> int:
        live = self._live_rows(batch_size, context_len, request_ids)
        if live is None:
            return 0
        b, key, rows = live
        return self._decide(b, key, self._row_al(rows).sum(axis=0))

    def _row_al(self, rows) -> np.ndarray:
        """AL_r(K) for K = 0.._kc per request row ([rows, _kc + 1])."""
        kc = self._kc
        al = np.ones((len(rows), kc + 1))
        np.cumsum(self._row_estimate(rows, kc), axis=1, out=al[:, 1:])
        al[:, 1:] += 1.0
        return al

    # ------------------------------------------------------------------ goodput tables

    def _al_vector(self, est: np.ndarray | None = None) -> np.ndarray:
        """AL(K) for K = 0.._kc from an acceptance estimate (default: the tables')."""
        est = self._est_tables if est is None else est
        al = np.ones(self._kc + 1)
        al[1:] += np.cumsum(est[: self._kc])
        return al

    def _itl_rows(self, key: int) -> np.ndarray:
        """ITL [max_batch_size + 1, _kc + 1] at a context bucket (row 0 copies row 1)."""
        itl = self._itl_cache.get(key)
        if itl is None:
            ctx = self._context_value(key)
            bs = [self._bucket(b) for b in range(1, self.max_batch_size + 1)]
            t = self.profile.itl_table(ctx, bs)[:, : self._kc + 1]
            if self._latency is not None:
                factors = {bk: self._latency.factors(bk) for bk in set(bs)}
                t = t * np.stack([factors[bk] for bk in bs])
            itl = np.concatenate([t[:1], t], axis=0)
            self._itl_cache[key] = itl
        return itl

    def _goodput_row(self, b: int, key: int, al: np.ndarray) -> np.ndarray:
        if b <= self.max_batch_size:
            itl = self._itl_rows(key)[b]
        else:
            ctx = self._context_value(key)
            itl = self.profile.itl_table(ctx, [self._bucket(b)])[0, : self._kc + 1]
            if self._latency is not None:
                itl = itl * self._latency.factors(self._bucket(b))
        g = al / itl
        if self._disable is not None and b > self._disable:
            g[1:] = 0.0
        return g

    def _build_table(self, key: int):
        al = self._al_vector()
        g = al[None, :] / self._itl_rows(key)
        g_prior = self._prior_al[None, :] / self._itl_rows(key)
        if self._disable is not None and self._disable < self.max_batch_size:
            g[self._disable + 1 :, 1:] = 0.0
            g_prior[self._disable + 1 :, 1:] = 0.0
        # (best K, goodput row, best K under the profile's acceptance: the probe K)
        tab = (np.argmax(g, axis=1).tolist(), g.tolist(), np.argmax(g_prior, axis=1).tolist())
        self._gtabs[key] = tab
        return tab

    def _bucket(self, b: int) -> int:
        if self._buckets is None:
            return b
        i = bisect.bisect_left(self._buckets, b)
        return self._buckets[i] if i < len(self._buckets) else b

    def _context_key(self, context_len) -> int:
        if isinstance(context_len, bool) or not isinstance(context_len, numbers.Real):
            raise ValueError(f"context_len must be a number or None, got {context_len!r}")
        c = float(context_len)
        if math.isnan(c):
            raise ValueError("context_len must not be NaN")
        grid = self.profile.context_lengths
        s = self._subdiv
        if len(grid) == 1 or c <= grid[0]:
            key = 0
        elif c >= grid[-1]:
            key = (len(grid) - 1) * s
        else:
            j = bisect.bisect_right(grid, c) - 1
            key = j * s + int(round((c - grid[j]) / (grid[j + 1] - grid[j]) * s))
        if len(self._ckey_cache) >= _CTX_CACHE_LIMIT:
            self._ckey_cache.clear()
        self._ckey_cache[context_len] = key
        return key

    def _context_value(self, key: int) -> float:
        grid = self.profile.context_lengths
        j, sub = divmod(key, self._subdiv)
        if sub == 0:
            return float(grid[j])
        return grid[j] + sub / self._subdiv * (grid[j + 1] - grid[j])

    def context_bucket(self, context_len: float | None) -> float:
        """The context length whose ITL the controller uses for `context_len`."""
        if self.profile is None:
            raise ValueError("context_bucket needs a profile")
        return self._context_value(0 if context_len is None else self._context_key(context_len))

    def predicted_goodput(self, batch_size: int, context_len: float | None = None) -> np.ndarray:
        """Goodput AL(K) / ITL(B, K) (tokens/ms/row) for K = 0..max candidate, as used by
        `choose_k` (the tables' acceptance estimate, bucketed context, disable rule)."""
        if self.profile is None or self.mode == "none":
            raise ValueError("predicted_goodput needs goodput mode (or a profile)")
        b = _index("batch_size", batch_size)
        if b < 1:
            raise ValueError(f"batch_size must be >= 1, got {b}")
        key = 0 if context_len is None else self._context_key(context_len)
        return self._goodput_row(b, key, self._al_vector())

    # ------------------------------------------------------------------ per-request state

    def _rows_for(self, request_ids) -> np.ndarray:
        rows = self._rows
        out = [rows.get(rid) for rid in request_ids]
        if None in out:
            out = [self._new_row(rid) if r is None else r for rid, r in zip(request_ids, out)]
        return np.array(out, dtype=np.intp)  # an index array: numpy gathers it faster than a list

    def _new_row(self, rid) -> int:
        if not self._free:
            n = self._Ar.shape[0]
            cap = max(16, 2 * n)
            self._Ar = np.concatenate([self._Ar, np.zeros((cap - n, self.max_k))])
            self._Nr = np.concatenate([self._Nr, np.zeros((cap - n, self.max_k))])
            self._free = list(range(cap - 1, n - 1, -1))
        r = self._free.pop()
        self._Ar[r] = self._Nr[r] = 0.0
        self._rows[rid] = r
        return r

    def _row_estimate(self, rows, k: int) -> np.ndarray:
        """a_1..a_k per request row: its own discounted counts, shrunk toward the global
        estimate as if that were ROW_PRIOR_STEPS more observed steps (a request lives
        for tens of steps: too few to trust alone, too many to ignore)."""
        return (self._Ar[rows, :k] + self._row_prior[:k]) / (self._Nr[rows, :k] + ROW_PRIOR_STEPS)

    def forget_request(self, rid: Hashable) -> None:
        """Drop a finished request's per-request acceptance (no-op if unknown)."""
        r = self._rows.pop(rid, None)
        if r is not None:
            self._free.append(r)

    def request_acceptance(self, rid: Hashable) -> np.ndarray | None:
        """A request's own acceptance estimate (per_request mode or the makespan
        objective), or None if unseen."""
        r = self._rows.get(rid)
        return None if r is None else self._row_estimate([r], self.max_k)[0]

    # ------------------------------------------------------------------ observe

    def observe(
        self,
        k: int,
        num_accepted,
        step_time_s: float | None = None,
        request_ids: Sequence[Hashable] | None = None,
        context_len: float | None = None,
    ) -> None:
        """Record one finished round that ran with `k` drafts.

        num_accepted[r]: drafts accepted in live row r (0..k); draft position i <= k
            counts as accepted iff num_accepted[r] >= i, and as proposed always.
        step_time_s: measured wall time of the round; with a profile, the predicted
            ITL is compared to it (`stats()['itl_mape']`).
        request_ids: one id per row (per_request mode and the makespan objective update
            each request's estimate).
        context_len: the context length the round ran at (for the ITL prediction).
        """
        k = _index("k", k)
        if not 0 <= k <= self.max_k:
            raise ValueError(f"k must be in 0..{self.max_k}, got {k}")
        try:
            acc = np.asarray(num_accepted)
        except Exception as e:  # noqa: BLE001  (ragged input etc.)
            raise ValueError(f"num_accepted must be a 1-D integer array: {e}") from None
        if acc.ndim == 0:
            acc = acc.reshape(1)
        if acc.ndim != 1:
            raise ValueError(f"num_accepted must be 1-D (one entry per live row), got shape {acc.shape}")
        if acc.size and acc.dtype.kind not in "iu":
            if acc.dtype.kind != "f" or not np.all(np.isfinite(acc)) or not np.all(acc == np.round(acc)):
                raise ValueError(f"num_accepted must hold integers, got dtype {acc.dtype}")
            acc = acc.astype(np.int64)
        if acc.size and (acc.min() < 0 or acc.max() > k):
            raise ValueError(f"num_accepted values must be in 0..k={k}, got range {acc.min()}..{acc.max()}")
        b = int(acc.size)
        if request_ids is not None and len(request_ids) != b:
            raise ValueError(f"request_ids has {len(request_ids)} entries but num_accepted has {b}")
        if step_time_s is not None:
            if isinstance(step_time_s, bool) or not isinstance(step_time_s, numbers.Real) or not (
                math.isfinite(float(step_time_s)) and step_time_s > 0
            ):
                raise ValueError(f"step_time_s must be a positive finite number, got {step_time_s!r}")

        self._steps += 1
        self._k_steps[k] += 1
        if b == 0:
            return
        use_req = self._track_rows and request_ids is not None
        rows = self._rows_for(request_ids) if use_req else None

        # Calibration: the controller's predictions for this step, before updating.
        rec = {"step": self._steps, "k": k, "batch_size": b}
        if k > 0:
            if use_req:
                pred_al = 1.0 + float(self._row_estimate(rows, k).sum()) / b
            else:
                pred_al = self._al_pred[k]
            meas_al = 1.0 + float(acc.sum()) / b
            rec["pred_al"] = pred_al
            rec["meas_al"] = meas_al
            if pred_al == pred_al:  # not NaN (no prior and no live data yet)
                self._al_err_sum += abs(pred_al - meas_al) / meas_al
                self._al_n += 1
        if step_time_s is not None:
            meas_ms = float(step_time_s) * 1e3
            rec["meas_itl_ms"] = meas_ms
            if self.profile is not None and k <= self.profile.max_k:
                bucket = self._bucket(b)
                profile_ms = self.profile.itl_ms(bucket, k, context_len)
                pred_ms = profile_ms
                if self._latency is not None and k <= self._kc:
                    pred_ms *= float(self._latency.factors(bucket)[k])
                    self._latency.observe(bucket, k, meas_ms, profile_ms)
                    self._refresh_latency()
                rec["profile_itl_ms"] = profile_ms
                rec["pred_itl_ms"] = pred_ms
                self._itl_err_sum += abs(pred_ms - meas_ms) / meas_ms
                self._itl_n += 1
        self._log.append(rec)

        if k == 0:
            return
        # accepted[i-1] = rows with num_accepted >= i, for i = 1..k
        accepted = np.bincount(acc, minlength=k + 1)[::-1].cumsum()[::-1][1:]
        keep = self._keep
        A, N = self._A, self._N
        A[:k] *= keep
        A[:k] += accepted
        N[:k] *= keep
        N[:k] += b
        if k > self._kseen:
            self._kseen = k
        self._spec_steps += 1
        if use_req:
            hits = acc[:, None] >= self._positions[:k]  # [B, k]
            self._Ar[rows, :k] = keep * self._Ar[rows, :k] + hits
            self._Nr[rows, :k] = keep * self._Nr[rows, :k] + 1.0
        self._set_estimate(self._compute_estimate())
        if self.mode == "goodput" and self._kc > 0:
            moved = np.abs(self._est[: self._kc] - self._est_tables[: self._kc]).max()
            if moved > self.refresh_tol:
                self._est_tables = self._est.copy()
                self._gtabs.clear()
                self._refreshes += 1

    def _refresh_latency(self) -> None:
        """Rebuilds the ITL rows and tables once a latency factor moved noticeably."""
        f = self._latency.log_factors()
        if self._lat_tables is not None and np.abs(f - self._lat_tables).max() <= LATENCY_REFRESH_TOL:
            return
        self._lat_tables = f
        self._itl_cache.clear()
        self._gtabs.clear()
        self._refreshes += 1

    def _set_estimate(self, est: np.ndarray) -> None:
        self._est = est
        self._row_prior = ROW_PRIOR_STEPS * np.nan_to_num(est)
        al = np.ones(self.max_k + 1)
        al[1:] += np.cumsum(est)
        self._al_pred = al.tolist()

    def _compute_estimate(self) -> np.ndarray:
        """Prior during warm-up; then live A/N on the positions seen so far (always a
        prefix 1..J: a step with k drafts proposes positions 1..k), the rest
        extrapolated from the prior's shape; made non-increasing."""
        prior = self._prior
        J = self._kseen
        if J == 0 or (self._spec_steps < self._warmup and not np.isnan(prior).all()):
            return prior.copy()
        est = prior.copy()
        est[:J] = self._A[:J] / self._N[:J]
        if J < self.max_k:
            p = prior[J - 1]
            if p > 0:  # False for NaN too
                est[J:] = est[J - 1] * np.minimum(1.0, prior[J:] / p)
            else:
                est[J:] = np.where(np.isnan(prior[J:]), np.nan, 0.0)
        # a_i = P(num_accepted >= i) is non-increasing in i (NaNs, if any, are a suffix).
        fin = ~np.isnan(est)
        est[fin] = np.minimum.accumulate(est[fin])
        return est

    # ------------------------------------------------------------------ reporting

    def acceptance_estimate(self) -> np.ndarray:
        """Current a_1..a_max_k (profile during warm-up, then live; NaN = no data)."""
        return self._est.copy()

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
        return bool(self._spec_steps >= self._warmup and self._kseen > 0)

    def predicted_al(self, k: int) -> float:
        """AL(k) = 1 + sum_{i<=k} a_i from the current estimate."""
        k = _index("k", k)
        if not 0 <= k <= self.max_k:
            raise ValueError(f"k must be in 0..{self.max_k}, got {k}")
        return self._al_pred[k]

    def calibration_log(self) -> list[dict]:
        """Recent per-step records: k, batch_size, pred/meas AL and ITL (ms)."""
        return list(self._log)

    def stats(self) -> dict:
        """mode, steps_observed, acceptance, itl_mape / al_mape (percent, None without
        data; ITL predictions include the learnt latency factors), k_choices (choose_k
        results) and k_steps (observed ks) histograms, probes (steps run at another K
        than the held one), and latency_factors ({batch bucket: factor per K} for the
        buckets with measured steps)."""
        return {
            "mode": self.mode,
            "steps_observed": self._steps,
            "spec_steps_observed": self._spec_steps,
            "using_live_acceptance": self.using_live_acceptance,
            "acceptance": [None if math.isnan(x) else float(x) for x in self._est],
            "itl_mape": 100.0 * self._itl_err_sum / self._itl_n if self._itl_n else None,
            "al_mape": 100.0 * self._al_err_sum / self._al_n if self._al_n else None,
            "k_choices": {k: c for k, c in enumerate(self._k_counts)},
            "k_steps": {k: c for k, c in enumerate(self._k_steps)},
            "current_k": self._cur,
            "table_refreshes": self._refreshes,
            "probes": self._probes,
            "latency_factors": self._latency.observed() if self._latency is not None else {},
        }
