"""The bench's workloads: what is generated, in which groups, with which lengths.

- *sweep*: for each batch size B, B held-out prompts (token ids, truncated to
  ``prompt_len``) generated together with fixed ``max_tokens``; small B runs several
  prompt groups one after another (at least ``rows_per_point`` prompts per point) so
  a single prompt's acceptance does not decide the point. Where the prompts allow, each
  repeat takes groups of its own (`fresh_groups`): a point then has repeats x groups
  independent pair units, and an interval even at B >= rows_per_point, where one group
  repeated had none.
- *rollout*: ``rollout_requests`` requests started together with heavy-tailed output
  lengths (seeded lognormal, capped), so the live batch shrinks to a long tail as in
  an RL rollout; ``rollout_units`` such rollouts, each with its own prompts and length
  draw (seed + u), are the point's pair units (one makespan says nothing about the next).

A workload is a list of `Point`s; each point's *pair units* (prompt groups) are what
every configuration runs back to back (`dsd_jax.bench.runner.run_interleaved`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from dsd_jax.bench.settings import Settings, mode
from dsd_jax.sampling import SamplingParams

ROLLOUT_SIGMA = 1.0


@dataclasses.dataclass
class Point:
    """One measured point: every configuration runs each of its pair units in turn."""
    workload: str  # "sweep", "rollout" or "side-by-side"
    batch_size: int | None  # None: the rollout, whose batch shrinks as requests finish
    units: list[list[list[int]]]  # pair units: prompt groups
    configs: list[str]
    sampling: Any = None  # what the engine generates with (SamplingParams or one per prompt)
    cells: dict = dataclasses.field(default_factory=dict)  # config -> runner.Cell
    unit_sampling: list | None = None  # per unit, where units differ (the rollouts' lengths)
    # None: every repeat runs every unit; G: repeat r runs units r*G .. r*G + G - 1, groups of
    # its own (`fresh_groups`)
    units_per_repeat: int | None = None

    def sampling_of(self, u: int):
        """What unit `u` generates with."""
        return self.sampling if self.unit_sampling is None else self.unit_sampling[u]

    def units_of(self, rep: int) -> range:
        """The units repeat `rep` runs."""
        g = self.units_per_repeat
        return range(len(self.units)) if g is None else range(rep * g, (rep + 1) * g)

    def pair_units(self, repeats: int) -> list[int]:
        """The unit of each timed pair, in the order `run_interleaved` runs them: the clusters
        of the paired intervals (`dsd_jax.bench.pairs.pair_groups`)."""
        return [u for rep in range(repeats) for u in self.units_of(rep)]

    @property
    def key(self) -> tuple:
        return self.workload, self.batch_size


def rollout_lengths(n: int, median: int, cap: int, sigma: float = ROLLOUT_SIGMA, seed: int = 0,
                    floor: int = 4) -> list[int]:
    """Heavy-tailed output lengths: lognormal(log(median), sigma), clipped to [floor, cap]."""
    rng = np.random.default_rng(seed)
    x = rng.lognormal(math.log(median), sigma, size=n)
    return np.clip(np.round(x), min(floor, cap), cap).astype(int).tolist()


def group_count(b: int, rows_per_point: int, repeats: int = 1, room: int | None = None,
                min_units: int = 0) -> int:
    """Prompt groups of b each repeat of a sweep point runs: ceil(rows_per_point / b), at
    least one; where its repeats take groups of their own (`fresh_groups`), more, up to
    ceil(min_units / repeats) as far as `room` prompts hold them, so the point has at least
    `min_units` pair units (at B >= rows_per_point one group a repeat gave 6 units, and
    intervals of +-5.6-7.8% at B = 8-32 in `bench_full_s21`, the units' ratios spreading 5-7%)."""
    n = max(1, -(-rows_per_point // b))
    if min_units and fresh_groups(b, rows_per_point, repeats, room):
        n = max(n, min(-(-min_units // repeats), room // (b * repeats)))
    return n


def prompt_groups(prompts: list[list[int]], b: int, count: int) -> list[list[list[int]]]:
    """`count` groups of b prompts, cycling through `prompts`."""
    return [[prompts[(g * b + i) % len(prompts)] for i in range(b)] for g in range(count)]


# Fewest repeats that take groups of their own: at 2 a one-group point would get a t interval
# on one degree of freedom, 12.7 standard errors wide (the demo's B=4 read 1.26x [0.08, 21.23])
FRESH_MIN_REPEATS = 3


def fresh_groups(b: int, rows_per_point: int, repeats: int, room: int | None) -> bool:
    """Whether each repeat of the sweep point at batch size b takes prompt groups of its own:
    at `FRESH_MIN_REPEATS` repeats or more, where `room` distinct prompts hold them all (None:
    no room given)."""
    return (room is not None and repeats >= FRESH_MIN_REPEATS
            and group_count(b, rows_per_point) * b * repeats <= room)


def sweep_prompts(batch_sizes, rows_per_point: int, repeats: int = 1, room: int | None = None,
                  min_units: int = 0) -> int:
    """Distinct prompts the sweep's groups take: `group_count` groups of B at the batch size
    that needs most, times the repeats where they are fresh (`fresh_groups`)."""
    return max(group_count(b, rows_per_point, repeats, room, min_units) * b
               * (repeats if fresh_groups(b, rows_per_point, repeats, room) else 1)
               for b in batch_sizes)


def sweep_room(s: Settings, n_prompts: int) -> int:
    """The prompts the sweep's groups may take: those given, less the profile's own."""
    return n_prompts - mode(s.quick)["profile_prompts"]


def check_distinct_groups(batch_sizes, rows_per_point: int, n_prompts: int) -> None:
    """Refuses sweep points whose prompt groups would repeat prompts: the intervals resample
    the groups as independent draws, and a repeated prompt makes them too narrow. (A point of
    one group may cycle: it has no interval.)"""
    for b in batch_sizes:
        n = group_count(b, rows_per_point)
        if n > 1 and n * b > n_prompts:
            raise ValueError(f"rows_per_point {rows_per_point} at batch size {b} takes {n} prompt groups of "
                             f"{b}, {n * b} distinct prompts, but {n_prompts} were given: groups that "
                             "repeat prompts would make the intervals too narrow")


def sweep(s: Settings, ids: list[list[int]]) -> list[Point]:
    prompts = [p[:s.prompt_len] for p in ids]
    # fixed lengths (as vLLM's benchmarks): the workload must not depend on when a model says end-of-text
    greedy = SamplingParams(temperature=0.0, max_tokens=s.max_tokens, ignore_eos=True)
    room = sweep_room(s, len(prompts))
    points = []
    for b in s.batch_sizes:
        fresh = fresh_groups(b, s.rows_per_point, s.repeats, room)
        count = group_count(b, s.rows_per_point, s.repeats, room, s.min_units)
        groups = prompt_groups(prompts, b, count * (s.repeats if fresh else 1))
        points.append(Point("sweep", b, groups, _configs_at(s, b), greedy,
                            units_per_repeat=count if fresh else None))
    return points


def _configs_at(s: Settings, batch_size: int) -> list[str]:
    return [c for c in s.configs if s.runs_at(c, batch_size)]


def rollout(s: Settings, ids: list[list[int]]) -> tuple[Point, list[list[int]]]:
    """The rollout point (`rollout_units` rollouts: unit u takes the next rollout_requests
    prompts, cycling, and lengths drawn with seed + u) and each unit's output lengths."""
    n, lengths, units = s.rollout_requests, [], []
    for u in range(s.rollout_units):
        lengths.append(rollout_lengths(n, s.rollout_median_tokens, s.rollout_max_tokens, seed=s.seed + u))
        units.append([ids[(u * n + i) % len(ids)][:s.rollout_prompt_len] for i in range(n)])
    sampling = [[SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in unit] for unit in lengths]
    return Point("rollout", None, units, _configs_at(s, n), unit_sampling=sampling), lengths


def rollout_meta(s: Settings, lengths: list[list[int]]) -> dict:
    return {"num_requests": s.rollout_requests, "prompt_len": s.rollout_prompt_len, "units": s.rollout_units,
            "lengths": lengths, "median_tokens": s.rollout_median_tokens, "max_tokens": s.rollout_max_tokens,
            "distribution": f"lognormal(log(median), {ROLLOUT_SIGMA}), clipped, seed + unit"}


def warmup_requests(s: Settings, ids: list[list[int]], n: int | None = None
                    ) -> tuple[list[list[int]], list[SamplingParams]]:
    """An untimed run whose live batch shrinks through every bucket: n (default max_batch)
    short prompts asking for 1..8 tokens."""
    n = n or s.max_batch
    prompts = [ids[i % len(ids)][:min(16, s.prompt_len)] for i in range(n)]
    return prompts, [SamplingParams(temperature=0.0, max_tokens=1 + (i * 8) // n, ignore_eos=True)
                     for i in range(n)]


def profile_prompts(s: Settings, ids: list[list[int]], n: int) -> list[list[int]]:
    """n acceptance prompts for profiling, disjoint from the sweep's and the rollout's
    prompts where there are enough."""
    sweep_used = sweep_prompts(s.batch_sizes, s.rows_per_point, s.repeats, sweep_room(s, len(ids)), s.min_units)
    used = max(s.max_batch, sweep_used, s.rollout_requests * s.rollout_units)
    start = used if len(ids) >= used + n else 0
    return [ids[(start + i) % len(ids)][:s.prompt_len] for i in range(n)]
