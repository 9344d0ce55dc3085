"""B = 4 group by group in the replay at the bench's step times (`true_itl.py`): two orders of
the 64 prompts; per group dynamic's time and Ks (one digit a round) beside static K = 0, 1, 2, 4.

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/trace_true_itl_b4.py
"""
import numpy as np

import sim
from true_itl import PROFILE, SWEEP, TRUTH

B = 4
ag, lens = SWEEP["agreement"], SWEEP["prompt_lens"]
print("profile ITL B=4 ctx~200:", [round(PROFILE.itl_ms(B, k, 200), 2) for k in range(7)])
print("truth   ITL B=4 ctx~200:", [round(TRUTH.itl_ms(B, k, 200), 2) for k in range(7)])
totals = []
for seed in range(2):
    order = np.random.default_rng(100 + seed).permutation(len(ag))
    dyn = sim.make_dynamic(PROFILE)
    for start in range(0, len(ag), B):
        g = order[start:start + B]
        rows = ([ag[j] for j in g], [lens[j] for j in g])
        steps = []
        ms = sim.run_unit(dyn, *rows, list(range(start, start + B)), [64] * B, TRUTH, trace=steps)
        static = [sim.run_unit(sim.static_controller(k), *rows, list(range(B)), [64] * B, TRUTH) for k in (0, 1, 2, 4)]
        ks = "".join(str(k) for k, _, _ in steps)
        print(f"seed {seed} group {start // B:2d}: dyn {ms:6.1f} static-0/1/2/4 "
              + " ".join(f"{t:6.1f}" for t in static) + f" static-1/dyn {static[1] / ms:.3f}  K {ks[:64]}")
        totals.append((ms, static))
dyn_ms = np.array([t[0] for t in totals])
static_ms = np.array([t[1] for t in totals])
print("sums: dynamic %.0f, static-0 %.0f, static-1 %.0f, static-2 %.0f, static-4 %.0f, per-group best static %.0f"
      % (dyn_ms.sum(), *static_ms.sum(0), static_ms.min(1).sum()))
