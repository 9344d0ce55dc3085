"""Live step latency relative to the profile, learnt per (batch bucket, K).

A profile is timed once, offline; live steps run at other context lengths, next
to other work, sometimes on a machine that has since slowed down. The controller
therefore multiplies each profiled ITL(bucket, K) by a factor learnt from the
step times it observes::

    x = log(measured_ms / profile_ms)           one observation of a cell, clipped
    cell (bucket, K):  L = keep * L + x,  W = keep * W + 1   (its own EMA)

The factor of a cell is exp of its mean log ratio shrunk toward its bucket's
mean (which weighs `PRIOR_STEPS` observations); a bucket without observations
takes the mean over all cells. The controller compares Ks within one bucket, so
only factors relative to the bucket's matter: a cell never run gets exactly the
bucket's factor, and a machine uniformly 20% slower than its profile scales
every K of a bucket alike and changes no decision. A K whose own steps are
measured relatively slower or faster moves away from the others only as far as
its evidence outweighs the prior.

`LatencyModel` is what the controller reads: the profile's ITL at the compiled
batch bucket a live batch runs in (the smallest that holds it, or a larger one the
profile shows faster at every cell: `buckets.serving_buckets`) and at a context
bucket (context lengths are rounded to `context_subdivisions` points per profiled
interval, so the tables built per bucket stay few), times the `LatencyCorrection`
when one is learnt.

The first K > 0 round after K = 0 rounds also runs the draft's catch-up on every
token committed since the draft last ran: a one-off the correction must not learn
as what each round of that K costs (it priced the probes at a held K = 0 out for
good). With the correction on, `LatencyModel.learn_probe` keeps it apart: what
such a round took beyond the predicted ITL(bucket, K), in predicted K = 0 steps,
averaged per batch bucket (`probe_excess`). The controller spaces its acceptance
probes by it and reads it nowhere else.
"""

from __future__ import annotations

import bisect
import math
import numbers
from typing import Any, Sequence

import numpy as np

from .buckets import serving_buckets
from .profile import Profile

__all__ = ["LatencyCorrection", "LatencyModel"]

# Single steps on a shared CPU scatter by 20% and more, and a cell's estimate stops
# moving once exploring ends, so the prior is strong: a K must be measured off its
# bucket for ~16 steps before half of that shows.
PRIOR_STEPS = 16.0  # observations the bucket mean weighs as the prior of a cell's mean
MAX_LOG_RATIO = math.log(1.5)  # one step counts as at most 1.5x off: a stall is not a trend
LEARNT_WEIGHT = 16.0  # (discounted) observations after which a cell is not explored any more
REFRESH_TOL = 0.01  # rebuild the ITL rows when a log factor moved by more than this (~1%)
# A probe's excess (the catch-up round beyond its K's step, in K = 0 steps): probes are rare
# (one every 16+ dispatches) and their lag varies, so a short discounted mean; one round
# counts as at most 64 K = 0 steps (a stall is not a catch-up), and a faster one as -4.
PROBE_EXCESS_WEIGHT = 0.25
PROBE_EXCESS_CLIP = (-4.0, 64.0)
PROBE_EXCESS_TOL = 0.02  # K = 0 steps the mean must move by before the controller's tables are rebuilt
_CTX_CACHE_LIMIT = 1 << 16  # context lengths remembered with their bucket


class LatencyCorrection:
    """Multiplicative corrections of a profile's ITL, per (batch bucket, K).

    Args:
      buckets: the batch buckets steps run at (sorted ints); other batch sizes get
        the global factor.
      num_k: corrections cover K = 0..num_k-1.
      forgetting: weight of a cell's newest observation in its average, in (0, 1].
    """

    def __init__(self, buckets: Sequence[int], num_k: int, forgetting: float):
        self._index = {int(b): i for i, b in enumerate(buckets)}
        self._keep = 1.0 - float(forgetting)
        # discounted weights saturate at 1 / forgetting: stop exploring before that
        self.learnt_weight = min(LEARNT_WEIGHT, 0.5 / float(forgetting))
        self._L = np.zeros((len(self._index), num_k))  # discounted sums of log ratios
        self._W = np.zeros((len(self._index), num_k))  # discounted observation counts
        self._log_factors = np.zeros_like(self._L)
        self.observations = 0

    def observe(self, bucket: int, k: int, measured_ms: float, profile_ms: float) -> None:
        i = self._index.get(int(bucket))
        if i is None or not 0 <= k < self._L.shape[1] or not (measured_ms > 0 and profile_ms > 0):
            return
        x = min(max(math.log(measured_ms / profile_ms), -MAX_LOG_RATIO), MAX_LOG_RATIO)
        self._L[i, k] = self._keep * self._L[i, k] + x
        self._W[i, k] = self._keep * self._W[i, k] + 1.0
        self.observations += 1
        self._log_factors = self._shrunk_log_factors()

    def _shrunk_log_factors(self) -> np.ndarray:
        w = self._W.sum(axis=1)
        bucket = np.where(w > 0, self._L.sum(axis=1) / np.maximum(w, 1e-300), self.global_log_factor())
        return (self._L + PRIOR_STEPS * bucket[:, None]) / (self._W + PRIOR_STEPS)

    def global_log_factor(self) -> float:
        """Mean log ratio over every observation still weighed (0 before any)."""
        w = self._W.sum()
        return float(self._L.sum() / w) if w > 0 else 0.0

    def factors(self, bucket: int) -> np.ndarray:
        """Factors for K = 0..num_k-1 at a batch bucket (the global one if unknown)."""
        i = self._index.get(int(bucket))
        if i is None:
            return np.full(self._L.shape[1], math.exp(self.global_log_factor()))
        return np.exp(self._log_factors[i])

    def log_factors(self) -> np.ndarray:
        """[buckets, num_k] log factors, rows in bucket order."""
        return self._log_factors.copy()

    def weights(self, bucket: int) -> list[float]:
        """Discounted number of observations per K at a bucket (0: never run)."""
        i = self._index.get(int(bucket))
        return [0.0] * self._W.shape[1] if i is None else self._W[i].tolist()

    def observed(self) -> dict[int, list[float]]:
        """{bucket: factors for K = 0..num_k-1} for the buckets with observations."""
        return {b: np.exp(self._log_factors[i]).round(4).tolist()
                for b, i in self._index.items() if self._W[i].sum() > 0}


class LatencyModel:
    """ITL(B, K) in ms as the controller predicts it; see the module docstring.

    Args:
      profile: the `Profile`.
      max_batch_size: `itl_rows` covers live batch sizes 1..max_batch_size.
      num_k: ITLs cover K = 0..num_k-1.
      batch_buckets: the engine's compiled batch buckets (sorted), or None: a live
        batch of n rows runs the program of the smallest bucket >= n, so its ITL is
        the profile's at that bucket, not the interpolation at n; or of a larger
        profiled bucket that is faster at every context and K (`serving`).
      context_subdivisions: context buckets per profiled context interval.
      forgetting: the `LatencyCorrection`'s (0: trust the profile, no correction).
    """

    def __init__(self, profile: Profile, max_batch_size: int, num_k: int, batch_buckets: Sequence[int] | None,
                 context_subdivisions: int, forgetting: float = 0.0):
        self.profile = profile
        self._max_b = max_batch_size
        self._num_k = num_k
        self._buckets = None if batch_buckets is None else list(batch_buckets)
        # {bucket: larger bucket its batches run in}; among buckets the profile timed itself
        self.serving = {} if self._buckets is None else serving_buckets(  # over the Ks the engine runs
            np.asarray(profile.latency_ms)[..., :num_k], profile.batch_sizes, candidates=self._buckets)
        self._subdiv = context_subdivisions
        self.correction = None
        if forgetting > 0:
            self.correction = LatencyCorrection(self._buckets or range(1, max_batch_size + 1), num_k, forgetting)
        self._log_factors = None  # the correction's log factors the cached rows were built with
        self._rows_cache: dict[int, np.ndarray] = {}
        self._catchup_cache: dict[int, np.ndarray] = {}
        self._key_cache: dict[Any, int] = {}
        # probe excess per batch bucket: discounted sums and weights (`learn_probe`)
        self._px_sum: dict[int, float] = {}
        self._px_w: dict[int, float] = {}
        self._px_built: dict[int, float] = {}  # the excess the last rows were built with
        self._px_rows = None

    # ---------------------------------------------------------------- buckets

    def bucket(self, b: int) -> int:
        """The batch bucket a live batch of b rows runs at (b past the largest)."""
        if self._buckets is None:
            return b
        i = bisect.bisect_left(self._buckets, b)
        smallest = self._buckets[i] if i < len(self._buckets) else b
        return self.serving.get(smallest, smallest)

    def context_key(self, context_len) -> int:
        """The context bucket of a context length (0: the first profiled one)."""
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
        if len(self._key_cache) >= _CTX_CACHE_LIMIT:
            self._key_cache.clear()
        self._key_cache[context_len] = key
        return key

    def cached_context_key(self, context_len) -> int:
        """`context_key`, a dict lookup for a context length seen before (the hot path)."""
        key = self._key_cache.get(context_len)
        return self.context_key(context_len) if key is None else key

    def context_value(self, key: int) -> float:
        """The context length of a context bucket."""
        grid = self.profile.context_lengths
        j, sub = divmod(key, self._subdiv)
        if sub == 0:
            return float(grid[j])
        return grid[j] + sub / self._subdiv * (grid[j + 1] - grid[j])

    # ---------------------------------------------------------------- predictions

    def itl_rows(self, key: int) -> np.ndarray:
        """ITL [max_batch_size + 1, num_k] at a context bucket (row 0 copies row 1); cached."""
        itl = self._rows_cache.get(key)
        if itl is None:
            ctx = self.context_value(key)
            bs = [self.bucket(b) for b in range(1, self._max_b + 1)]
            t = self.profile.itl_table(ctx, bs)[:, : self._num_k]
            if self.correction is not None:
                factors = {bk: self.correction.factors(bk) for bk in set(bs)}
                t = t * np.stack([factors[bk] for bk in bs])
            itl = np.concatenate([t[:1], t], axis=0)
            self._rows_cache[key] = itl
        return itl

    def itl(self, b: int, key: int) -> np.ndarray:
        """ITL for K = 0..num_k-1 at live batch size b >= 1 and a context bucket."""
        if b <= self._max_b:
            return self.itl_rows(key)[b]
        bucket = self.bucket(b)
        itl = self.profile.itl_table(self.context_value(key), [bucket])[0, : self._num_k]
        if self.correction is not None:
            itl = itl * self.correction.factors(bucket)
        return itl

    def catchup_ms(self, b: int, key: int) -> float:
        """What the draft's catch-up on a row's whole context (the context bucket's length)
        adds to a step at b's batch bucket, from the profile's `catchup_ms` (0 without it:
        a drafter that never lags, or a profile from before it was measured)."""
        c = self.profile.catchup_ms
        if c is None:
            return 0.0
        rounds = max(1, math.ceil(self.context_value(key) / c["chunk"]))  # lagging at least a round
        return rounds * float(np.interp(self.bucket(b), self.profile.batch_sizes, c["ms"]))

    def catchup_rows(self, key: int) -> np.ndarray:
        """`catchup_ms` for live batch sizes 0..max_batch_size (row 0 copies row 1); cached."""
        rows = self._catchup_cache.get(key)
        if rows is None:
            rows = np.array([self.catchup_ms(max(b, 1), key) for b in range(self._max_b + 1)])
            self._catchup_cache[key] = rows
        return rows

    def predict_ms(self, b: int, k: int, context_len: float | None) -> tuple[float, float] | None:
        """(profile ITL, predicted ITL) of one step, at the exact context length; None
        when the profile has no such k."""
        if k > self.profile.max_k:
            return None
        bucket = self.bucket(b)
        profile_ms = self.profile.itl_ms(bucket, k, context_len)
        pred_ms = profile_ms
        if self.correction is not None and k < self._num_k:
            pred_ms *= float(self.correction.factors(bucket)[k])
        return profile_ms, pred_ms

    def learn(self, b: int, k: int, measured_ms: float, profile_ms: float) -> bool:
        """Feeds a measured step to the correction. True when that rebuilt the ITLs
        (a factor moved by more than REFRESH_TOL), so tables made from them are stale."""
        if self.correction is None or k >= self._num_k:
            return False
        self.correction.observe(self.bucket(b), k, measured_ms, profile_ms)
        f = self.correction.log_factors()
        if self._log_factors is not None and np.abs(f - self._log_factors).max() <= REFRESH_TOL:
            return False
        self._log_factors = f
        self._rows_cache.clear()
        return True

    def learn_probe(self, b: int, k: int, measured_ms: float, context_len) -> bool:
        """Feeds the measured time of a first K > 0 round after K = 0 rounds (a probe at a
        held K = 0, or the first round of a move off it): what it took beyond the predicted
        ITL(bucket, K), in predicted K = 0 steps, enters its batch bucket's discounted mean
        (`probe_excess`). Nothing without a correction (`latency_forgetting` 0 trusts the
        profile). True when a bucket's mean moved by more than PROBE_EXCESS_TOL since the
        rows `probe_excess_rows` returns were built."""
        if self.correction is None or not measured_ms > 0:
            return False
        pk, p0 = self.predict_ms(b, k, context_len), self.predict_ms(b, 0, context_len)
        if pk is None or not p0[1] > 0:
            return False
        x = min(max((measured_ms - pk[1]) / p0[1], PROBE_EXCESS_CLIP[0]), PROBE_EXCESS_CLIP[1])
        bk, keep = self.bucket(b), 1.0 - PROBE_EXCESS_WEIGHT
        self._px_sum[bk] = keep * self._px_sum.get(bk, 0.0) + x
        self._px_w[bk] = keep * self._px_w.get(bk, 0.0) + 1.0
        if abs(self.probe_excess(b) - self._px_built.get(bk, 0.0)) <= PROBE_EXCESS_TOL:
            return False
        self._px_rows = None
        return True

    def probe_excess(self, b: int) -> float:
        """What a first K > 0 round after K = 0 rounds took beyond its K's step at b's batch
        bucket, in K = 0 steps (`learn_probe`; at least 0, and 0 where none was measured)."""
        bk = self.bucket(b)
        w = self._px_w.get(bk, 0.0)
        return max(0.0, self._px_sum[bk] / w) if w > 0 else 0.0

    def probe_excess_rows(self) -> np.ndarray:
        """`probe_excess` for live batch sizes 0..max_batch_size (row 0 copies row 1); cached."""
        if self._px_rows is None:
            self._px_rows = np.array([self.probe_excess(max(b, 1)) for b in range(self._max_b + 1)])
            self._px_built = {bk: self.probe_excess(bk) for bk in self._px_w}
        return self._px_rows

    def observed_probe_excess(self) -> dict[int, float]:
        """{bucket: `probe_excess`} for the buckets where such a round was measured."""
        return {bk: round(self.probe_excess(bk), 4) for bk in sorted(self._px_w)}

    # ---------------------------------------------------------------- learning state

    @property
    def learnt_weight(self) -> float:
        """Observations after which a (bucket, K) counts as learnt (inf without a correction)."""
        return math.inf if self.correction is None else self.correction.learnt_weight

    def weights(self, b: int) -> list[float]:
        """Discounted observations per K at b's batch bucket (all 0 without a correction)."""
        if self.correction is None:
            return [0.0] * self._num_k
        return self.correction.weights(self.bucket(b))

    def observed(self) -> dict[int, list[float]]:
        """{bucket: factors per K} for the buckets with measured steps."""
        return {} if self.correction is None else self.correction.observed()
