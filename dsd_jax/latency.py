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
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# Single steps on a shared CPU scatter by 20% and more, and a cell's estimate stops
# moving once exploring ends, so the prior is strong: a K must be measured off its
# bucket for ~16 steps before half of that shows.
PRIOR_STEPS = 16.0  # observations the bucket mean weighs as the prior of a cell's mean
MAX_LOG_RATIO = math.log(1.5)  # one step counts as at most 1.5x off: a stall is not a trend
LEARNT_WEIGHT = 16.0  # (discounted) observations after which a cell is not explored any more


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
