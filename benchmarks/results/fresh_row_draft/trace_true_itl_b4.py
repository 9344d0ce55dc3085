import json, sys, tempfile, collections
import numpy as np
sys.path[:0] = ["benchmarks/results/replay"]
import sim, sequence
from dsd_jax.profile import Profile
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
ag, lens = sweep["agreement"], sweep["prompt_lens"]
b = 4
print("profile ITL B=4 ctx~200:", [round(prof.itl_ms(4, k, 200), 2) for k in range(7)])
print("truth   ITL B=4 ctx~200:", [round(truth.itl_ms(4, k, 200), 2) for k in range(7)])
totals = []
for seed in range(2):
    order = np.random.default_rng(100 + seed).permutation(len(ag))
    dyn = sim.make_dynamic(prof)
    for start in range(0, 64, b):
        g = order[start:start + b]
        tr_d, tr_s = [], []
        md = sim.run_unit(dyn, [ag[j] for j in g], [lens[j] for j in g], list(range(start, start + b)), [64] * b, truth, trace=tr_d)
        st = [sim.run_unit(sim.static_controller(k), [ag[j] for j in g], [lens[j] for j in g], [0, 1, 2, 3], [64] * b, truth)
              for k in (0, 1, 2, 4)]
        ks = "".join(str(k) for k, _, _ in tr_d)
        print(f"seed {seed} group {start//b:2d}: dyn {md:6.1f} static-0/1/2/4 {st[0]:6.1f} {st[1]:6.1f} {st[2]:6.1f} {st[3]:6.1f}"
              f" static-1/dyn {st[1]/md:.3f}  K {ks[:64]}")
        totals.append((md, st))

d = np.array([t[0] for t in totals]); st = np.array([t[1] for t in totals])
print("sums: dynamic %.0f, static-0 %.0f, static-1 %.0f, static-2 %.0f, static-4 %.0f, per-group best static %.0f"
      % (d.sum(), *st.sum(0), st.min(1).sum()))
