"""Replay (true step times = profile x the bench's learnt ratios): dynamic against dynamic whose
rows' first-draft rates are drawn from their Beta posteriors at every decision (Thompson)."""
import json, sys, tempfile
import numpy as np
sys.path[:0] = ["benchmarks/results/replay"]
import sim, sequence
from dsd_jax.acceptance import ROW_PRIOR_STEPS
from dsd_jax.profile import Profile
LEARNT = {1: [1.03, 1.07, 1.09, 1.09, 1.09, 1.09, 1.08], 2: [1.12, 1.07, 1.11, 1.13, 1.10, 1.11, 1.11],
          4: [1.10, 1.08, 1.11, 1.13, 1.13, 1.13, 1.13], 8: [1.00, 1.03, 1.04, 1.02, 1.02, 1.02, 1.02],
          16: [1.06, 1.07, 1.07, 1.07, 1.07, 1.07, 1.07], 32: [1.04] * 7,
          64: [1.05, 1.14, 1.10, 1.10, 1.10, 1.10, 1.10]}
path = "benchmarks/results/fresh_row_draft/bench_ab.profile.json"
prof = Profile.load(path)
raw = json.load(open(path))
ratio = np.array([LEARNT[b][: len(raw["ks"])] for b in raw["batch_sizes"]])
raw["latency_ms"] = (np.array(raw["latency_ms"]) * ratio[None]).tolist()
f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False); json.dump(raw, f); f.close()
truth = Profile.load(f.name)
sweep = json.load(open("benchmarks/results/replay/sweep.json"))

def thompson(ctl, seed=0, scale=1.0):
    rq = ctl._requests; rng = np.random.default_rng(seed); orig = rq.estimate
    def est(rows, k):
        a = orig(rows, k)
        rows = np.asarray(rows)
        alpha = rq.accepted[rows, 0] + rq._prior_counts[0]
        n = rq.reached[rows, 0] + ROW_PRIOR_STEPS
        c1 = alpha / n
        s = rng.beta(np.maximum(alpha / scale, 1e-3), np.maximum((n - alpha) / scale, 1e-3))
        return np.minimum(a * (s / np.maximum(c1, 1e-9))[:, None], 1.0)
    rq.estimate = est
    return ctl

variants = {"static-0": lambda: sim.static_controller(0), "static-1": lambda: sim.static_controller(1),
            "static-2": lambda: sim.static_controller(2), "static-4": lambda: sim.static_controller(4),
            "dynamic": lambda: sim.make_dynamic(prof), "thompson": lambda: thompson(sim.make_dynamic(prof))}
n = len(sweep["agreement"])
for b in [int(x) for x in sys.argv[1:]] or (1, 2, 4, 8, 16):
    times = {name: [] for name in variants}
    for seed in range(8):
        order = np.random.default_rng(100 + seed).permutation(n)
        for name, make in variants.items():
            times[name].append(sequence.total_ms(make(), sweep, order, b, truth))
    k0 = np.array(times["static-0"])
    print(f"B={b}: " + "  ".join(f"{name} {np.exp(np.log(k0 / np.array(v)).mean()):.3f}" for name, v in times.items()), flush=True)
