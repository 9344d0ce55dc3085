"""Dynamic's latency factors learnt from every timed round (old) against only from steady
rounds (`Controller.observe(steady=)`: not a lone round while no request queues), and steady
rounds learnt relative to their bucket's drifting level (`DriftRelative`, an experiment),
paired in one process on one engine, with static K=4 beside them: B=1, then B=2 (the controllers carry what they learnt
at B=1, as in the full bench), greedy, 64 tokens a request, held-out prompts cut to 128
tokens, bench_full_s28's profile; each unit runs the three in a rotated order.

    python benchmarks/results/b2_dynamic/steady_ab.py [units_b1] [units_b2] > steady_ab.log
"""

import collections
import math
import sys
import time

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.latency import MAX_LOG_RATIO, PRIOR_STEPS, LatencyCorrection
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile
from dsd_jax.stats import paired_ratio

PROFILE = "benchmarks/results/bench_full_s28.profile.json"


class LearnsFromEveryRound(Controller):
    """The controller before `steady=`: every timed round trains the latency factors."""

    def observe(self, *args, steady=True, **kwargs):
        return super().observe(*args, **kwargs)


class DriftRelative(LatencyCorrection):
    """A cell learns its step times relative to its bucket's level at the time (an average
    over every K's steps there), and its factor is that level now times its shrunk
    deviation: a K last run while the machine ran slow does not stay priced slow."""

    def __init__(self, buckets, num_k, forgetting):
        super().__init__(buckets, num_k, forgetting)
        self._level = np.zeros(len(self._index))
        self._level_w = np.zeros(len(self._index))

    def observe(self, bucket, k, measured_ms, profile_ms):
        i = self._index.get(int(bucket))
        if i is None or not 0 <= k < self._L.shape[1] or not (measured_ms > 0 and profile_ms > 0):
            return
        x = min(max(math.log(measured_ms / profile_ms), -MAX_LOG_RATIO), MAX_LOG_RATIO)
        self._level[i] = self._keep * self._level[i] + x
        self._level_w[i] = self._keep * self._level_w[i] + 1.0
        self._L[i, k] = self._keep * self._L[i, k] + (x - self._level[i] / self._level_w[i])
        self._W[i, k] = self._keep * self._W[i, k] + 1.0
        self.observations += 1
        self._log_factors = self._shrunk_log_factors()

    def _shrunk_log_factors(self):
        level = np.where(self._level_w > 0, self._level / np.maximum(self._level_w, 1e-300), self.global_log_factor())
        return level[:, None] + self._L / (self._W + PRIOR_STEPS)

    def global_log_factor(self):
        w = self._level_w.sum()
        return float(self._level.sum() / w) if w > 0 else 0.0


def drift_relative(ctl):
    old = ctl._latency.correction
    ctl._latency.correction = DriftRelative(sorted(old._index), old._L.shape[1], 1.0 - old._keep)
    return ctl


def main():
    units = {1: int(sys.argv[1]) if len(sys.argv) > 1 else 96, 2: int(sys.argv[2]) if len(sys.argv) > 2 else 48}
    target, draft, tok = builtin()
    prof = Profile.load(PROFILE)
    buckets = [1, 2]
    dyn = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))
    ctls = {"static-4": Controller(SpecConfig(method="draft_model", num_speculative_tokens=4), None, 2,
                                   batch_buckets=buckets),
            "dynamic-old": LearnsFromEveryRound(dyn, prof, 2, batch_buckets=buckets),
            "dynamic-new": Controller(dyn, prof, 2, batch_buckets=buckets),
            "dynamic-drift": drift_relative(Controller(dyn, prof, 2, batch_buckets=buckets))}
    engine = SpecEngine(target, draft, dyn, max_batch_size=2, max_seq_len=448, batch_buckets=buckets,
                        controller=ctls["static-4"], profile=prof)
    engine.warmup()
    ids = [tok.encode(p).ids[:128] for p in heldout_prompts(2 * units[2] + units[1])]
    sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    names = list(ctls)
    start = 0
    for b in (1, 2):
        walls = collections.defaultdict(list)
        hist = collections.defaultdict(collections.Counter)
        for u in range(units[b]):
            group = ids[start + u * b:start + (u + 1) * b]
            for name in names[u % len(names):] + names[:u % len(names)]:
                engine.controller = ctls[name]
                engine.stats.reset()
                engine.reset_prefix_cache()
                t0 = time.perf_counter()
                engine.generate(group, sampling)
                walls[name].append(time.perf_counter() - t0)
                hist[name].update(engine.stats.k_hist)
        start += units[b] * b
        print(f"B={b}: {units[b]} units")
        for name in names:
            h = hist[name]
            total = sum(h.values())
            print(f"  {name}: median {b * 64 / np.median(walls[name]):.1f} tok/s, K "
                  + " ".join(f"K{k}:{100 * v / total:.0f}%" for k, v in sorted(h.items())))
        for a, ref in (("dynamic-new", "dynamic-old"), ("dynamic-drift", "dynamic-old"), ("dynamic-drift", "dynamic-new"),
                       ("dynamic-old", "static-4"), ("dynamic-new", "static-4"), ("dynamic-drift", "static-4")):
            # speed ratio a / ref = ref's wall / a's wall, per unit
            r = paired_ratio(walls[ref], walls[a])
            print(f"  {a} / {ref}: {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        for name in ("dynamic-old", "dynamic-new", "dynamic-drift"):
            f = ctls[name].stats()["latency_factors"]
            print(f"  {name} learnt factors:", {bk: [round(x, 3) for x in v] for bk, v in f.items()})
        sys.stdout.flush()


if __name__ == "__main__":
    main()
