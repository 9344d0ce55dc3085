"""The replay at the bench's own step times: the A/B's profile with each (bucket, K) cell
scaled by the ratio the bench's rule-less controller learnt online (`bench_ab.log`,
"dynamic-throughput's learnt step time / profiled ITL"). Controllers price with `PROFILE`;
steps cost `TRUTH`'s ITL, and the controllers learn those step times, as in the bench.
Shared by the scripts beside it (run from the repo root with
PYTHONPATH=benchmarks/results/replay:benchmarks/results/b4_k0:benchmarks/results/fresh_row_draft)."""
import json

import numpy as np

import sequence
import sim
from dsd_jax.profile import Profile
from step_times import learnt_ratios, measured_profile

PROFILE_PATH = "benchmarks/results/fresh_row_draft/bench_ab.profile.json"
LEARNT = learnt_ratios("benchmarks/results/fresh_row_draft/bench_ab.log")

PROFILE = Profile.load(PROFILE_PATH)
TRUTH = measured_profile(PROFILE_PATH, LEARNT)
SWEEP = json.load(open("benchmarks/results/replay/sweep.json"))
STATIC = {f"static-{k}": (lambda k=k: sim.static_controller(k)) for k in (0, 1, 2, 4)}


def compare(variants, batch_sizes, orders=8) -> None:
    """Per batch size, K = 0's time over each variant's (name -> controller factory, "static-0"
    among them) at the true step times: the geometric mean over `orders` random orders."""
    n = len(SWEEP["agreement"])
    for b in batch_sizes:
        times = {name: [] for name in variants}
        for seed in range(orders):
            order = np.random.default_rng(100 + seed).permutation(n)
            for name, make in variants.items():
                times[name].append(sequence.total_ms(make(), SWEEP, order, b, TRUTH))
        k0 = np.array(times["static-0"])
        print(f"B={b}: " + "  ".join(f"{name} {np.exp(np.log(k0 / np.array(v)).mean()):.3f}"
                                     for name, v in times.items()), flush=True)
