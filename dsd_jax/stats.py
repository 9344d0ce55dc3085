"""Paired comparisons of two benchmark configurations, with honest confidence intervals.

Benchmarks on shared machines drift: a run of configuration A at minute 3 and one of
B at minute 7 differ by the machine as much as by the configurations. The benchmarks
therefore run configurations in *interleaved pairs* (same prompts, back to back, in
rotated order), and this module compares them pair by pair:

    res = paired_ratio(tokens_per_s_of_a, tokens_per_s_of_b)   # one entry per pair
    res["ratio"], res["lo"], res["hi"]      # e.g. 1.23, 1.18, 1.29
    is_real(res)                            # the interval excludes 1
    resolution(res)                         # e.g. 0.04: differences under ~4% are not resolved
    paired_ratio(a, b, clusters=groups)     # repeats of one prompt group resampled together

Estimator: the geometric mean of the paired ratios a_i / b_i (the mean of the paired
log-ratios), not the ratio of the two medians, because

- pairing is what cancels the drift: a pair's two runs share the machine's state and
  the prompts, so the log-ratio of a pair is far less noisy than either run; a ratio
  of medians throws the pairing away;
- log-ratios are symmetric (A vs B is exactly the reciprocal of B vs A) and add up,
  so the mean is the natural centre; the bootstrap distribution of a mean is smooth,
  while the bootstrap of a median of a handful of pairs takes only a few distinct
  values and gives lumpy, too-narrow intervals.

Units: the interval resamples *units*, by default each pair. Pairs that are not
independent must be grouped with ``clusters=`` (a label per pair): the bench's repeats
of one prompt group share that group's acceptance, so they are one unit (at B=1 the
group means varied 29x more than the repeats' noise allows, and treating the repeats as
independent gave intervals about half as wide as the data support). ``n`` is then the
number of groups: what an interval can rest on.

Interval, by the number of units n:

- n = 1: none (``lo`` and ``hi`` None): one unit says nothing about the next one.
- n <= 4: Student's t on the units' mean log-ratios, t_{n-1} * s / sqrt(n). A bootstrap
  of 2-4 units takes a handful of values (at n = 2 it is [min, max] stretched, 93%
  coverage under normal noise); t is exact for normal log-ratios.
- n >= 5: a percentile bootstrap over the units (resampled with replacement, numpy,
  fixed seed: the same data always give the same interval; a resampled estimate is the
  mean log-ratio over every pair of the resampled units), widened about the point
  estimate for small samples. A plain percentile interval of a mean is about
  z * s / sqrt(n) * sqrt((n - 1) / n) wide, while Student's t interval (the honest one
  for n normal log-ratios) is t_{n-1} * s / sqrt(n): with 5 units the bootstrap is 37%
  too narrow and would call noise a finding. Each side is therefore stretched by
  t_{n-1} / (z * sqrt((n - 1) / n)) (-> 1 for large n), which equals the t interval
  for symmetric data and keeps the bootstrap's asymmetry for skewed data.

Only numpy and the standard library are used.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import numpy as np

__all__ = ["paired_ratio", "ratios_to", "reciprocal", "is_real", "resolution", "resolves", "verdict", "format_ratio",
           "t_quantile", "SMALL_N", "TARGET"]

SMALL_N = 4  # up to this many units the interval is Student's t (a bootstrap of so few is lumpy)
TARGET = 0.05  # the difference a benchmark result must be able to tell (`resolves`)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (p in (0.5, 1)).

    Exact for df 1 and 2; Cornish-Fisher expansion in 1/df otherwise (within 0.5% of
    the tabulated value at df = 3 for p = 0.975, and closer as df grows)."""
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"need 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z ** 3 + z) / (4 * v)
            + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * v ** 4))


def _positive_pairs(a, b) -> tuple[np.ndarray, np.ndarray]:
    try:
        a = np.asarray(a, dtype=float).ravel()
        b = np.asarray(b, dtype=float).ravel()
    except (TypeError, ValueError):
        raise ValueError("paired_ratio needs two sequences of numbers") from None
    if a.size == 0 or b.size == 0:
        raise ValueError("paired_ratio needs at least one pair, got an empty sequence")
    if a.size != b.size:
        raise ValueError(f"paired_ratio needs paired samples of equal length, got {a.size} and {b.size}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("paired_ratio needs finite values (got nan or inf)")
    if np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("paired_ratio needs positive values (a throughput or a time), got a value <= 0")
    return a, b


def _units(logs: np.ndarray, clusters) -> tuple[np.ndarray, np.ndarray]:
    """(sum of log-ratios, number of pairs) per unit: each pair, or each cluster label."""
    if clusters is None:
        return logs, np.ones_like(logs)
    labels = list(clusters)
    if len(labels) != logs.size:
        raise ValueError(f"clusters needs one label per pair, got {len(labels)} for {logs.size} pairs")
    # ids by first appearance: any hashable label (a tuple, None) is one unit; np.unique on an
    # array of them fails on tuples ("object too deep") and on None (it sorts)
    try:
        ids = {label: i for i, label in enumerate(dict.fromkeys(labels))}
    except TypeError:
        raise ValueError("clusters needs hashable labels (a number, a string, a tuple)") from None
    idx = np.array([ids[label] for label in labels], dtype=np.intp)
    return np.bincount(idx, weights=logs), np.bincount(idx).astype(float)


def paired_ratio(a: Sequence[float], b: Sequence[float], n_boot: int = 2000, ci: float = 0.95,
                 seed: int = 0, clusters: Sequence | None = None) -> dict:
    """How many times larger `a` is than `b`, from pairs (a[i], b[i]) measured together.

    a, b: positive numbers of equal length, one entry per interleaved pair (e.g.
    tokens/s of two configurations on the same prompt group in the same repeat).
    clusters: a label per pair (any hashable value); pairs with one label are one unit of
    the interval (the repeats of one prompt group). None: every pair is its own unit.
    Returns ``{"ratio", "lo", "hi", "n", "pairs", "ci", "method"}``: the geometric mean of
    a[i] / b[i] over every pair, its `ci` confidence interval and how it was made
    ("t" or "bootstrap", see the module docstring), ``n`` the number of units. With a
    single unit there is no interval: ``lo``, ``hi`` and ``method`` are None.
    """
    a, b = _positive_pairs(a, b)
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if int(n_boot) < 100:
        raise ValueError(f"n_boot must be >= 100, got {n_boot}")
    logs = np.log(a) - np.log(b)
    sums, counts = _units(logs, clusters)
    n = sums.size
    centre = float(logs.mean())
    out = {"ratio": math.exp(centre), "lo": None, "hi": None, "n": int(n), "pairs": int(logs.size),
           "ci": float(ci), "method": None}
    if n < 2:
        return out
    tail = (1.0 - ci) / 2.0
    t = t_quantile(1.0 - tail, n - 1)
    if n <= SMALL_N:
        half = t * float(np.std(sums / counts, ddof=1)) / math.sqrt(n)
        lo, hi, method = centre - half, centre + half, "t"
    else:
        rng = np.random.default_rng(seed)
        pick = rng.integers(0, n, size=(int(n_boot), n))
        means = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)  # every pair of the resampled units
        q_lo, q_hi = np.quantile(means, [tail, 1.0 - tail])
        stretch = t / (statistics.NormalDist().inv_cdf(1.0 - tail) * math.sqrt((n - 1) / n))
        lo, hi = centre - stretch * (centre - float(q_lo)), centre + stretch * (float(q_hi) - centre)
        method = "bootstrap"
    out.update(lo=math.exp(lo), hi=math.exp(hi), method=method)
    return out


def ratios_to(samples: dict, baseline, clusters: Sequence | None = None, **kw) -> dict:
    """`paired_ratio(samples[c], samples[baseline], clusters=clusters)` for every key c of
    `samples` (one entry per pair in each list, in the same order); None where there is no
    baseline or the two lists are not paired (different lengths, empty)."""
    ref = samples.get(baseline)
    out = {}
    for c, xs in samples.items():
        ok = ref is not None and xs is not None and len(xs) == len(ref) > 0
        out[c] = paired_ratio(xs, ref, clusters=clusters, **kw) if ok else None
    return out


def reciprocal(res: dict | None) -> dict | None:
    """The same comparison the other way round (b / a): e.g. a throughput ratio as a time ratio."""
    if not res:
        return res
    inv = lambda x: None if x is None else 1.0 / x  # noqa: E731
    return {**res, "ratio": 1.0 / res["ratio"], "lo": inv(res["hi"]), "hi": inv(res["lo"])}


def is_real(res: dict | None) -> bool:
    """True when the interval excludes 1: the data show a difference in a known direction."""
    return bool(res) and res.get("lo") is not None and (res["lo"] > 1.0 or res["hi"] < 1.0)


def resolution(res: dict | None) -> float | None:
    """The smallest relative difference these data can resolve: the interval's half-width
    (in log space, as a fraction: 0.04 = differences under ~4% are within the noise)."""
    if not res or res.get("lo") is None:
        return None
    return math.sqrt(res["hi"] / res["lo"]) - 1.0


def resolves(res: dict | None, target: float = TARGET) -> bool:
    """True when the interval is narrow enough to tell a `target` difference (half-width
    at most `target`); False without an interval."""
    width = resolution(res)
    return width is not None and width <= target


def verdict(res: dict | None) -> str:
    """"higher", "lower" (a real difference) or "unresolved"."""
    if not is_real(res):
        return "unresolved"
    return "higher" if res["lo"] > 1.0 else "lower"


def format_ratio(res: dict | None, digits: int = 2) -> str:
    """``1.23x [1.18, 1.29]* +-4.5%``: the interval, ``*`` when it excludes 1 (a real
    difference) and its half-width (`resolution`); ``1.23x [n=1: no interval]`` without one."""
    if not res:
        return "-"
    if res.get("lo") is None:
        return f"{res['ratio']:.{digits}f}x [n={res.get('n', 1)}: no interval]"
    return (f"{res['ratio']:.{digits}f}x [{res['lo']:.{digits}f}, {res['hi']:.{digits}f}]"
            + ("*" if is_real(res) else "") + f" +-{100 * resolution(res):.1f}%")
