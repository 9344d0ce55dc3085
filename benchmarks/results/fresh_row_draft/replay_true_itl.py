"""Does the replay flip to the bench's verdict on the fresh-row rule once its step times are the
bench's measured ones? The controllers price with the A/B's profile (`bench_ab.profile.json`),
but each step costs that profile's ITL times the ratio the bench's rule-less controller learnt
online (`bench_ab.log`, "dynamic-throughput's learnt step time / profiled ITL", per batch
bucket and K): the live steps were 2-13% dearer than profiled, unevenly over K. The replay
feeds those step times to the controllers, which learn them as in the bench.

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/b4_k0 \\
        python benchmarks/results/fresh_row_draft/replay_true_itl.py
"""
import json
import sys
import tempfile

import numpy as np

sys.argv = [sys.argv[0], "benchmarks/results/fresh_row_draft/bench_ab.profile.json"]
import replay_k1_while_fresh as r  # noqa: E402  (its variants, at the A/B's profile; prints its table first)
import sequence  # noqa: E402
from dsd_jax.profile import Profile  # noqa: E402

LEARNT = {1: [1.03, 1.07, 1.09, 1.09, 1.09, 1.09, 1.08], 2: [1.12, 1.07, 1.11, 1.13, 1.10, 1.11, 1.11],
          4: [1.10, 1.08, 1.11, 1.13, 1.13, 1.13, 1.13], 8: [1.00, 1.03, 1.04, 1.02, 1.02, 1.02, 1.02],
          16: [1.06, 1.07, 1.07, 1.07, 1.07, 1.07, 1.07], 32: [1.04] * 7,
          64: [1.05, 1.14, 1.10, 1.10, 1.10, 1.10, 1.10]}

raw = json.load(open(sys.argv[1]))
ratio = np.array([LEARNT[b][: len(raw["ks"])] for b in raw["batch_sizes"]])
raw["latency_ms"] = (np.array(raw["latency_ms"]) * ratio[None]).tolist()
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(raw, f)
truth = Profile.load(f.name)

print("== step times: the profile x the bench's learnt ratios; controllers priced by the profile")
n = len(r.sweep["agreement"])
for b in (4, 8):
    times = {name: [] for name in r.variants}
    for seed in range(8):
        order = np.random.default_rng(100 + seed).permutation(n)
        for name, make in r.variants.items():
            times[name].append(sequence.total_ms(make(), r.sweep, order, b, truth))
    k0 = np.array(times["static-0"])
    print(f"B={b}: " + "  ".join(f"{name} {np.exp(np.log(k0 / np.array(v)).mean()):.3f}" for name, v in times.items()),
          flush=True)
