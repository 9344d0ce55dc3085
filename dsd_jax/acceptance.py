"""Draft acceptance estimates for the K controller (numpy only, no JAX).

``a_i`` = P(draft position i accepted), unconditional (= P(num_accepted >= i)),
for i = 1..max_k; the expected tokens per row per step with K drafts is
``AL(K) = 1 + sum_{i<=K} a_i`` (`al_curve`).

Both estimators count *conditional* rates, c_i = P(n >= i | n >= i - 1): of the rows
whose step proposed draft i and accepted drafts 1..i-1, the share that accepted draft i
as well; a_i = c_1 c_2 ... c_i. Every step with K >= 1 informs c_1, only steps with K >= i
inform c_i, so a_i moves with a_1 even where the live data holds no step that proposed
draft i (counting a_i directly, a row or stretch seen at K = 1 alone kept a_2..a_K from
older steps: a row accepting 27% of its first drafts was credited with AL(4) = 2.0, and
ran K = 4 alone in a batch's tail, accepting nothing).

`GlobalAcceptance`: the batch-wide estimate. It is the prior (the profile's
acceptance) until ``warmup_steps`` steps with K > 0 have been observed, then live
per-position counts with exponential forgetting (discounted counts: each step's
counts are added after multiplying the history by ``1 - forgetting``; at a steady
batch size the newest step weighs ``forgetting``). Where the live data has no row that
reached a draft (no step proposed it after accepting the ones before it), its rate is
the prior's, c_i = prior_i / prior_(i-1), but past the last draft rows did reach at least
the live rate there: a held K never proposes the drafts above it, and with the prior's
rates there a K accepting every draft looked no worse off at K + 2, so it was held for
good (live c = 0.99 at B = 1 held K = 4 where K = 6 is 9% faster). Counts of a draft the
steps stopped proposing fade too, at a quarter of the forgetting, and once less than
`FRESH_ROWS` discounted rows back them the same fallback tops them up: a stretch of hard
prompts left low rates at drafts 2-6 that a later hold at K = 1 never revised (easy
prompts after it ran K = 1 for good: 1.45x the time of K = 6 at B = 1, simulated). The
price is an occasional retry of a K whose drafts past the hold really are rejected (0.3%
at B = 1 where c = 0.9, 0.9, 0.9, 0.2, ...; at the full forgetting 0.9%).

`RequestAcceptance`: one estimate per live request, its own discounted counts of each
conditional rate shrunk toward a target as if that were `ROW_PRIOR_STEPS` more
observed steps (a request lives for tens of steps: too few to trust alone, too many to
ignore). The target is the global estimate's rates, except at draft 1 once
`PRIOR_MIN_REQUESTS` finished requests ran drafts: there it is their mean c_1, each
request weighing one (`shrink_target`). A fresh request is a draw from the requests,
not from the steps: the global estimate weighs steps, so at B = 1 it is the last
request's tail, and after a hard request (where K = 0 wins) the next one started at
its c_1, held K = 0 and ran no draft to learn otherwise (the replay of 64 held-out
prompts at B = 1: four easy ones after hard ones took 1.3-1.9x static K = 4's time).
c_1 decides K = 0 against speculating, and every request that ran a draft informs it;
deeper rates rest on the few steps that reached them (the requests' mean c_5 came out
0.5-0.7 most of the replay where all steps give 0.9), and with them in the target too
dynamic ran K = 5 at B = 1 where K = 4 was best
(`benchmarks/results/request_prior_fresh/`). It also learns how far requests differ:
the spread (standard deviation) of the true AL_r(K) between finished requests, from
their own counts less the counts' sampling noise (method of moments); a finished
request that ran too few drafts to tell counts as one at the mean, so a spread nothing
refreshes fades. Shrinkage hides that spread from a request with little data of its
own (a fresh one *is* the target); `makespan_steps` puts it back, with each step's own
randomness, into the steps the slowest of B requests needs (the makespan objective of
`dsd_jax.controller`).
"""

from __future__ import annotations

import functools
import statistics
from typing import Hashable, Sequence

import numpy as np

__all__ = ["GlobalAcceptance", "PRIOR_MIN_REQUESTS", "RequestAcceptance", "ROW_PRIOR_STEPS", "al_curve",
           "check_num_accepted", "conditional_rates", "expected_max_normal", "padded_prior", "tokens_variance"]

ROW_PRIOR_STEPS = 4  # weight of the shrink target in each request's own estimate, in steps
PRIOR_MIN_REQUESTS = 4  # finished requests that ran drafts before their mean c_1 is the shrink target
SPREAD_MIN_STEPS = 1.5  # a finished request informs the spread from two speculative steps on
SPREAD_FORGETTING = 1 / 32  # weight of the newest finished request in the spread and the mean c_1
# GlobalAcceptance: a draft's counts count in full from this many (discounted) rows that
# reached it; below, a fallback tops them up (`GlobalAcceptance._compute_rates`).
FRESH_ROWS = 1.0
# ... and the counts of a draft a step did not propose fade at this share of the forgetting.
STALE_FORGETTING = 0.25


@functools.lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] = integral of x n phi(x) Phi(x)^(n-1) (0 for n = 1)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-9.0, 9.0, 3601)
    normal = statistics.NormalDist()
    cdf = np.array([normal.cdf(v) for v in x])
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)
    return float((x * n * pdf * cdf ** (n - 1)).sum() * (x[1] - x[0]))  # the ends are ~0: a plain sum


def al_curve(a: np.ndarray, k: int) -> np.ndarray:
    """AL(K) = 1 + sum_{i<=K} a_i for K = 0..k, along the last axis of `a`."""
    al = np.ones(a.shape[:-1] + (k + 1,))
    np.cumsum(a[..., :k], axis=-1, out=al[..., 1:])  # in place: the per-request path is hot
    al[..., 1:] += 1.0
    return al


def padded_prior(acceptance: Sequence[float] | None, max_k: int) -> np.ndarray:
    """a_1..a_max_k from a profile's acceptance (None: no prior), NaN where it stops."""
    prior = np.full(max_k, np.nan)
    if acceptance is not None and max_k > 0:
        n = min(max_k, len(acceptance))
        prior[:n] = acceptance[:n]
    return prior


def conditional_rates(a: np.ndarray) -> np.ndarray:
    """c_i = a_i / a_(i-1) (c_1 = a_1) along the last axis: 0 after a zero, NaN where a is."""
    before = np.concatenate([np.ones(a.shape[:-1] + (1,)), a[..., :-1]], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(before > 0, a / np.where(before > 0, before, 1.0), np.where(np.isnan(a), np.nan, 0.0))


def _known(x: np.ndarray) -> np.ndarray:
    """`x` with its unknowns (NaN) as 0: `np.nan_to_num` for rates and acceptances, which
    are finite or NaN, at a fraction of its host time (the controller calls it every round)."""
    return np.where(np.isnan(x), 0.0, x)


def _rates(accepted: np.ndarray, reached: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """accepted / reached where a row reached the draft, `fallback` elsewhere."""
    seen = reached > 0
    return np.where(seen, accepted / np.where(seen, reached, 1.0), fallback)


def _reach_counts(num_accepted: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows with n >= i, rows with n >= i - 1) for i = 1..k, from per-row counts n."""
    accepted = np.bincount(num_accepted, minlength=k + 1)[::-1].cumsum()[::-1][1:]
    reached = np.concatenate([[num_accepted.size], accepted[:-1]])
    return accepted, reached


def check_num_accepted(k: int, num_accepted) -> np.ndarray:
    """num_accepted (drafts accepted per live row of a step with k drafts) as a 1-D
    integer array, checked to hold values in 0..k."""
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
    return acc


def tokens_variance(a: np.ndarray, k: int | None = None) -> np.ndarray:
    """Var of the drafts accepted in one step, min(n, K), for K = 0..k (default: all of
    `a`), along the last axis, when P(n >= i) = a_i is non-increasing in i. The
    indicators [n >= i] are nested: E[min(n, K)^2] = sum_{i, j <= K} a_max(i, j) =
    sum_{m <= K} (2m - 1) a_m."""
    k = a.shape[-1] if k is None else k
    a = a[..., :k]
    var = np.zeros(a.shape[:-1] + (k + 1,))
    mean = np.cumsum(a, axis=-1)
    var[..., 1:] = np.cumsum((2.0 * np.arange(1, k + 1) - 1.0) * a, axis=-1) - mean * mean
    return var


class GlobalAcceptance:
    """The batch-wide a_1..a_max_k; see the module docstring.

    Args:
      prior: a_1..a_max_k before live data (NaN = unknown), e.g. `padded_prior`.
      forgetting: weight of the newest step, in (0, 1].
      warmup_steps: steps with K > 0 observed before live counts replace the prior
        (a prior of all NaN is replaced at once).

    `estimate` and `al` are replaced, never modified in place, by `observe`.
    """

    def __init__(self, prior: np.ndarray, forgetting: float, warmup_steps: int = 0):
        self.max_k = len(prior)
        self._set_prior(prior)
        self.keep = 1.0 - forgetting
        self.stale_keep = 1.0 - forgetting * STALE_FORGETTING
        self._warmup = warmup_steps
        # Live discounted counts per draft position 1..max_k: rows that accepted draft i
        # and rows that reached it (accepted drafts 1..i-1), over the steps proposing it.
        self._A = np.zeros(self.max_k)
        self._R = np.zeros(self.max_k)
        self.kseen = 0  # live data covers draft positions 1..kseen
        self.steps = 0  # observed steps with K > 0
        self._update()

    def _set_prior(self, prior: np.ndarray) -> None:
        self.prior = np.asarray(prior, dtype=float)
        self.prior_rates = conditional_rates(self.prior)
        self._prior_rates = self.prior_rates.tolist()

    def use_prior(self, prior: np.ndarray) -> None:
        """Replaces the prior (of the same length); the live counts stay."""
        if len(prior) != self.max_k:
            raise ValueError(f"prior has {len(prior)} entries, not {self.max_k}")
        self._set_prior(prior)
        self._update()

    @property
    def live(self) -> bool:
        """Whether the estimate comes from live counts (warm-up done, data seen)."""
        return self.steps >= self._warmup and self.kseen > 0

    def observe(self, k: int, num_accepted: np.ndarray) -> None:
        """One step with `k` > 0 drafts; num_accepted[r] in 0..k per live row (non-empty)."""
        accepted, reached = _reach_counts(num_accepted, k)
        keep = self.keep
        A, R = self._A, self._R
        A[:k] *= keep
        A[:k] += accepted
        R[:k] *= keep
        R[:k] += reached
        # drafts this step did not propose: their counts age too, more slowly (`_compute_rates`)
        A[k:] *= self.stale_keep
        R[k:] *= self.stale_keep
        if k > self.kseen:
            self.kseen = k
        self.steps += 1
        self._update()

    def _update(self) -> None:
        self.rates = self._compute_rates()
        self.estimate = np.cumprod(self.rates)
        self.al = [1.0]  # AL(K), K = 0..max_k: `al_curve`'s sums in plain Python (a few floats)
        drafts = 0.0
        for a in self.estimate.tolist():
            drafts += a
            self.al.append(1.0 + drafts)

    def _compute_rates(self) -> np.ndarray:
        """c_1..c_max_k: the prior's during warm-up; then live A / R where at least
        `FRESH_ROWS` (discounted) rows reached the draft. Where fewer did, a fallback tops
        the counts up to that weight: the prior's rate, and past the last draft that many
        rows reached at least the live rate there. See the module docstring."""
        if self.kseen == 0 or (self.steps < self._warmup and not np.isnan(self.prior).all()):
            return self.prior_rates.copy()
        A, R = self._A.tolist(), self._R.tolist()  # a few floats: plain Python is faster
        fresh = [i for i, r in enumerate(R) if r >= FRESH_ROWS]
        if len(fresh) == len(R):
            return self._A / self._R
        last = A[fresh[-1]] / R[fresh[-1]] if fresh else None  # the rate there
        rates = []
        for i, (a, r, p) in enumerate(zip(A, R, self._prior_rates)):
            if r >= FRESH_ROWS:
                rates.append(a / r)
                continue
            if last is not None and i > fresh[-1] and p == p:  # a NaN prior stays unknown
                p = max(p, last)
            if p != p:
                rates.append(a / r if r > 0 else p)
            else:
                rates.append((a + (FRESH_ROWS - r) * p) / FRESH_ROWS)
        return np.array(rates)


class RequestAcceptance:
    """Per-request a_i, shrunk toward a `GlobalAcceptance`; see the module docstring.

    Requests are rows of three [rows, max_k] count arrays, `accepted` (steps that
    accepted draft i), `reached` (steps that proposed draft i and accepted the ones
    before it) and `proposed` (steps that proposed draft i), discounted with the global
    estimator's forgetting; a finished request's row is reused (`forget`).
    """

    def __init__(self, shrink_toward: GlobalAcceptance):
        self._global = shrink_toward
        self.max_k = shrink_toward.max_k
        self.row_of: dict[Hashable, int] = {}
        self._free: list[int] = []
        self.accepted = np.zeros((0, self.max_k))
        self.reached = np.zeros((0, self.max_k))
        self.proposed = np.zeros((0, self.max_k))
        self._positions = np.arange(1, self.max_k + 1)
        self._prior_of = None  # (global rates, finished count) `_prior_counts` was made from
        self._prior_counts = np.zeros(self.max_k)
        # The last `estimate` (counts version, rows, result): the controller asks for the same
        # rows' estimate at the same counts when it chooses K and when it scores that round.
        self._version = 0  # moves whenever any row's counts or the shrink target do
        self._memo = None
        # finished requests that ran drafts: how many, and the discounted sum of their own
        # first-draft rates (the request-weighted c_1 rows are shrunk toward, `shrink_target`)
        self._finished_c1 = 0.0
        self._finished_count = 0
        # discounted (weight, sum AL, sum AL^2, sum sampling variance) over finished
        # requests, K = 0..max_k
        self._moments = np.zeros((4, self.max_k + 1))
        self._informed = np.zeros(self.max_k + 1, dtype=int)  # finished requests that informed each K
        self._spread = np.zeros(self.max_k + 1)

    def rows_for(self, request_ids: Sequence[Hashable]) -> np.ndarray:
        """The rows of these requests (unseen ones get a fresh row)."""
        rows = self.row_of
        out = [rows.get(rid) for rid in request_ids]
        if None in out:
            out = [self._new_row(rid) if r is None else r for rid, r in zip(request_ids, out)]
        return np.array(out, dtype=np.intp)  # an index array: numpy gathers it faster than a list

    def _new_row(self, rid: Hashable) -> int:
        if not self._free:
            n = self.accepted.shape[0]
            cap = max(16, 2 * n)
            self.accepted, self.reached, self.proposed = (
                np.concatenate([x, np.zeros((cap - n, self.max_k))])
                for x in (self.accepted, self.reached, self.proposed))
            self._free = list(range(cap - 1, n - 1, -1))
        r = self._free.pop()
        self.accepted[r] = self.reached[r] = self.proposed[r] = 0.0
        self.counts_changed()
        self.row_of[rid] = r
        return r

    def forget(self, rid: Hashable, finished: bool = True) -> None:
        """Drop a request (no-op if unknown); its row is reused. A finished one first informs
        the spread; an unfinished one (its run abandoned) does not: it would have aged the
        spread learnt from finished requests, or added a truncated curve to it."""
        r = self.row_of.pop(rid, None)
        if r is not None:
            if finished:
                self._learn_spread(r)
                self._learn_prior(r)
            self._free.append(r)

    def _learn_prior(self, r: int) -> None:
        """Folds a finished request's own first-draft rate into the request-weighted mean."""
        if self.reached[r, 0] <= 0:
            return  # it ran no drafts
        self._finished_c1 = (1.0 - SPREAD_FORGETTING) * self._finished_c1 + self.accepted[r, 0] / self.reached[r, 0]
        self._finished_count += 1

    def shrink_target(self) -> np.ndarray:
        """c_1..c_max_k each row's own counts are shrunk toward: at draft 1, the mean of
        finished requests' own rates, each request weighing one (discounted by
        SPREAD_FORGETTING per newer request) once PRIOR_MIN_REQUESTS have run drafts;
        the global (step-weighted) rates elsewhere. See the module docstring."""
        g = _known(self._global.rates)
        n = self._finished_count
        if n < PRIOR_MIN_REQUESTS:
            return g
        weight = (1.0 - (1.0 - SPREAD_FORGETTING) ** n) / SPREAD_FORGETTING  # sum of the n discounts
        return np.concatenate([[self._finished_c1 / weight], g[1:]])

    def _learn_spread(self, r: int) -> None:
        """Folds a finished request's own AL_r(K) curve, and the sampling variance of
        that estimate, into the discounted moments of each K whose drafts it ran."""
        n = np.concatenate([[0.0], self.proposed[r]])  # steps that proposed draft K, K = 0..max_k
        informs = n >= SPREAD_MIN_STEPS  # two steps at least: one cannot tell a rate from luck
        if not informs.any():
            self._age_spread()
            return
        own = np.cumprod(_rates(self.accepted[r], self.reached[r], _known(self._global.rates)))
        al = al_curve(own, self.max_k)
        m = self._moments
        m[:, informs] *= 1.0 - SPREAD_FORGETTING
        m[0, informs] += 1.0
        m[1, informs] += al[informs]
        m[2, informs] += al[informs] ** 2
        # the sampling variance of its mean over n steps, from its own steps' variance (unbiased)
        m[3, informs] += tokens_variance(own)[informs] / (n[informs] - 1.0)
        self._informed += informs
        self._spread = self._compute_spread()

    def _age_spread(self) -> None:
        """A finished request that ran (almost) no drafts counts as one at the mean: the
        spread learnt from older requests fades as if newer ones had shown none. Left as
        it was, a spread learnt before a hold at K = 0 priced every probe out under the
        makespan objective and nothing ran drafts again to revise it (after a mixed
        workload, groups that all accepted 0.9 took 1.39x a fresh controller's time at B=8)."""
        m = self._moments
        seen = m[0] > 0
        if not seen.any():
            return
        mean = m[1, seen] / m[0, seen]
        m[:, seen] *= 1.0 - SPREAD_FORGETTING
        m[0, seen] += 1.0
        m[1, seen] += mean
        m[2, seen] += mean * mean
        self._spread = self._compute_spread()

    def _compute_spread(self) -> np.ndarray:
        w, s1, s2, noise = self._moments
        learnt = self._informed >= 2
        spread = np.zeros(self.max_k + 1)
        if not learnt.any():
            return spread
        mean = s1[learnt] / w[learnt]
        spread[learnt] = np.sqrt(np.maximum(s2[learnt] / w[learnt] - mean * mean - noise[learnt] / w[learnt], 0.0))
        # Ks no request ran yet (the learnt ones are a prefix 1..J): in proportion to the
        # drafts the global estimate expects, so an unexplored K never looks the safest
        j = int(np.flatnonzero(learnt)[-1])
        drafts = np.array(al_curve(_known(self._global.estimate), self.max_k)) - 1.0
        if j < self.max_k and drafts[j] > 0:
            spread[j + 1:] = spread[j] * drafts[j + 1:] / drafts[j]
        return spread

    def spread(self) -> np.ndarray:
        """Standard deviation of the true AL_r(K) between finished requests, K = 0..max_k:
        the variance of their own estimates less its sampling part (method of moments over
        the requests that ran K drafts at least twice, and requests that ran no K that often
        at the mean; zeros until two have; Ks beyond the last learnt one scaled by the
        expected drafts accepted)."""
        return self._spread.copy()

    def makespan_steps(self, rows, remaining: np.ndarray, k: int, batch_size: int,
                       acceptance: np.ndarray | None = None) -> np.ndarray:
        """Steps each row needs for its `remaining` tokens at K = 0..k ([rows, k + 1]),
        as the slowest of `batch_size` rows would: the expected R / AL_r(K), plus z_B
        standard deviations of that count. Two things spread it: each step's tokens are
        random (a renewal count: variance R Var_r / AL_r^3), and a row with little data
        of its own may accept worse than its estimate says (the learnt spread between
        requests on the share its own counts do not cover yet; all of it for a fresh
        row). Shrunk toward the mean, B fresh rows would all look average, and a batch
        nothing refills lasts as long as its slowest row. `acceptance` (a_1..a_k, e.g. the
        profile's): the same rows accepting at these rates instead of their estimates."""
        if acceptance is None:
            est = self.estimate(rows, k)
        else:
            est = np.broadcast_to(np.asarray(acceptance, dtype=float)[:k], (len(rows), k))
        est = np.minimum.accumulate(est, axis=-1)
        al = al_curve(est, k)
        rem = remaining[:, None]
        steps = rem / al
        z = expected_max_normal(batch_size)
        if not z:
            return steps
        var = rem * tokens_variance(est, k) / al**3
        if self._spread[: k + 1].any():
            hidden = ROW_PRIOR_STEPS / (ROW_PRIOR_STEPS + self.proposed[rows, 0])
            var += (steps / al) ** 2 * hidden[:, None] * self._spread[None, : k + 1] ** 2
        return steps + z * np.sqrt(var)

    def observe(self, rows: np.ndarray, num_accepted: np.ndarray, k: int) -> None:
        """One step with `k` > 0 drafts; num_accepted[j] is row rows[j]'s count."""
        keep = self._global.keep
        hits = num_accepted[:, None] >= self._positions[:k]  # [B, k]
        reached = num_accepted[:, None] >= self._positions[:k] - 1
        self.accepted[rows, :k] = keep * self.accepted[rows, :k] + hits
        self.reached[rows, :k] = keep * self.reached[rows, :k] + reached
        self.proposed[rows, :k] = keep * self.proposed[rows, :k] + 1.0
        self.counts_changed()

    def counts_changed(self) -> None:
        """Marks the rows' counts as changed (anything writing `accepted`, `reached` or
        `proposed` calls it): `estimate` recomputes."""
        self._version += 1

    def estimate(self, rows, k: int) -> np.ndarray:
        """a_1..a_k per row ([len(rows), k], read-only): the product of its conditional rates,
        each its own counts plus `ROW_PRIOR_STEPS` rows at `shrink_target`'s rate. A draft
        position the row never proposed takes at least the rate of the last one it did (see
        `_untried_at_least_last`). Asked again for the same rows and no more drafts before
        anything changed, it returns the first columns of the last result: the same numbers,
        since a row's rates at drafts 1..k do not depend on the drafts past k."""
        key = (self._global.rates, self._finished_count)
        if self._prior_of is None or key[0] is not self._prior_of[0] or key[1] != self._prior_of[1]:
            self._prior_of = key  # the global estimate moved or a request finished since
            self._prior_counts = ROW_PRIOR_STEPS * self.shrink_target()
            self.counts_changed()
        rows = np.asarray(rows, dtype=np.intp)
        memo, which = self._memo, rows.tobytes()
        if memo is not None and memo[0] == self._version and memo[1] == which and memo[2].shape[1] >= k:
            kept = memo[2]
            return kept if kept.shape[1] == k else kept[:, :k].copy()  # contiguous: sums as a fresh one
        own = (self.accepted[rows, :k] + self._prior_counts[:k]) / (self.reached[rows, :k] + ROW_PRIOR_STEPS)
        est = np.cumprod(self._untried_at_least_last(own, rows, k), axis=-1)
        est.flags.writeable = False
        self._memo = (self._version, which, est)
        return est

    def _untried_at_least_last(self, own: np.ndarray, rows, k: int) -> np.ndarray:
        """Raises each row's rates at the positions it never proposed to its rate at the
        last position it did, where that is higher. Its own data cannot reach a position
        its K never proposed, and the global rate there is every row's: a row accepting
        all of its K = 4 drafts was held at K = 4 (the global c_5, c_6 made K = 6 look no
        better), never learning that it accepted all 6 too (the bench's easiest B=1 prompts,
        10-15% below static K = 6). A hard row keeps the global rates (no worse a guess), and
        so does a row that never reached its last proposed draft (no rate of its own there)."""
        tried = (self.proposed[rows, :k] > 0).sum(axis=1)  # positions 1..tried were proposed
        grow = (tried > 0) & (tried < k)
        if not grow.any():
            return own
        idx = np.flatnonzero(grow)
        idx = idx[self.reached[rows[idx], tried[idx] - 1] > 0]  # its own data at the last
        if not idx.size:
            return own
        last = own[idx, tried[idx] - 1][:, None]
        untried = np.arange(k)[None, :] >= tried[idx, None]
        own = own.copy()
        own[idx] = np.where(untried, np.maximum(own[idx], last), own[idx])
        return own

    def request(self, rid: Hashable) -> np.ndarray | None:
        """A request's a_1..a_max_k, or None if unseen."""
        r = self.row_of.get(rid)
        return None if r is None else self.estimate([r], self.max_k)[0].copy()
