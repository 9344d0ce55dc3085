"""Paired comparisons between the bench's configurations (`dsd_jax.stats` on result rows).

Every (prompt group, repeat) of the sweep and every (rollout, repeat) of the rollout
point is a *pair unit*: all configurations ran it back to back, so their tokens/s are compared pair by
pair (``tokens_per_s_pairs``), and each configuration's ratio to vanilla and to the
best static K carries a paired 95% interval. The repeats of one prompt group share its
prompts' acceptance, so the interval resamples prompt groups, not pairs
(`pair_groups`, ``clusters=`` of `dsd_jax.stats.paired_ratio`): ``n`` is the number of
groups (the rollouts, at the rollout point). Where the prompts allow, every repeat of a
sweep point takes groups of its own (`dsd_jax.bench.workloads.fresh_groups`), so its n is
repeats x groups; a point with one group over every repeat (a single rollout, or a sweep
without the prompts for fresh groups at B >= rows_per_point) has no interval. A difference is called real only when its interval excludes 1.
"""

from __future__ import annotations

import numpy as np

from dsd_jax import stats
from dsd_jax.bench.settings import parse_config


def points(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(workload, batch size) -> config -> row, for the sweep and rollout rows."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["workload"] in ("sweep", "rollout"):
            out.setdefault((r["workload"], r.get("batch_size")), {})[r["config"]] = r
    return out


def throughput_score(r: dict) -> float:
    """Geometric mean of the paired tokens/s (the ranking the paired ratios give), else the median."""
    pairs = r.get("tokens_per_s_pairs")
    return float(np.exp(np.mean(np.log(pairs)))) if pairs else r["tokens_per_s"]


def best_static(pts: dict[str, dict]) -> str | None:
    """The static-K configuration with the highest throughput at a point (None: none ran),
    ranked as the paired ratios rank them. Chosen from the same data it is then compared
    with, so "better than the best static" is, if anything, slightly understated."""
    statics = {c: throughput_score(r) for c, r in pts.items() if parse_config(c)[0] == "static"}
    return max(statics, key=statics.get) if statics else None


def pair_groups(r: dict) -> list[int] | None:
    """The prompt group of each of a row's paired samples: the row's ``pair_units``
    (`Point.pair_units`: a repeat's groups of its own are units of their own). Rows written
    before it lay them out repeat after repeat (``pairs[rep * G + g]``,
    `dsd_jax.bench.runner.run_interleaved`), so G is the number of pairs over the repeats.
    None where the row says neither (hand-made rows): each pair is then its own unit."""
    pairs = r.get("tokens_per_s_pairs") or []
    units = r.get("pair_units")
    if units is not None and len(units) == len(pairs):
        return list(units)
    reps = r.get("repeats") or len(r.get("tokens_per_s_repeats") or [])
    if not pairs or not reps or len(pairs) % reps:
        return None
    groups = len(pairs) // reps
    return [i % groups for i in range(len(pairs))]


def pair_ratios(pts: dict[str, dict], baseline: str | None) -> dict[str, dict | None]:
    """Each configuration's paired interval against `baseline` at one point, prompt groups
    resampled whole (None without pairs)."""
    if not baseline or baseline not in pts:
        return {c: None for c in pts}
    samples = {c: r.get("tokens_per_s_pairs") for c, r in pts.items()}
    return stats.ratios_to(samples, baseline, clusters=pair_groups(pts[baseline]))


def add_intervals(rows: list[dict]) -> list[dict]:
    """Sets ``vs_vanilla``, ``best_static`` and ``vs_best_static`` (paired ratios of tokens/s
    over prompt groups, `dsd_jax.stats.paired_ratio`) on every sweep and rollout row, in place."""
    for pts in points(rows).values():
        best = best_static(pts)
        vs_v, vs_s = pair_ratios(pts, "vanilla"), pair_ratios(pts, best)
        for c, r in pts.items():
            r["vs_vanilla"], r["best_static"], r["vs_best_static"] = vs_v[c], best, vs_s[c]
    return rows


def verdict_entry(res: dict, **where) -> dict:
    """A paired ratio with its verdict: "higher"/"lower" when the interval excludes 1, else "unresolved"."""
    return {**where, **res, "real": stats.is_real(res), "verdict": stats.verdict(res),
            "resolution": stats.resolution(res)}


def differences(by_point: dict[tuple, dict[str, dict]]) -> list[dict]:
    """Every configuration against vanilla and against the best static K, with its verdict."""
    out = []
    for (workload, b), pts in by_point.items():
        best = best_static(pts)
        for baseline, ratios in (("vanilla", pair_ratios(pts, "vanilla")), (best, pair_ratios(pts, best))):
            for c, res in ratios.items():
                if res is None or c == baseline or (baseline == best and c == "vanilla"):
                    continue
                out.append(verdict_entry(res, workload=workload, batch_size=b, config=c, baseline=baseline))
    return out
