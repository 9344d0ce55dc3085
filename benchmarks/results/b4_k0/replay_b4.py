"""The replay of today's bench at B=4 (`../replay/sequence.py`'s first order, 16 groups of
4 of the 64 sweep prompts, one controller through them), group by group: dynamic's K per
step, and its time beside static K=1's and K=0's (each group alone), with each row's m
(drafts the target accepts from each position; 6 = all).

    PYTHONPATH=benchmarks/results/replay python benchmarks/results/b4_k0/replay_b4.py \\
        benchmarks/results/bench_full_s21.profile.json > benchmarks/results/b4_k0/replay_b4.log
"""
import json
import sys

import numpy as np

import sim
from dsd_jax.profile import Profile

sweep = json.load(open("benchmarks/results/replay/sweep.json"))
profile = Profile.load(sys.argv[1])
agreement, lens = sweep["agreement"], sweep["prompt_lens"]
order = np.random.default_rng(100).permutation(len(agreement))  # sequence.py's order 0
ctl = sim.make_dynamic(profile)
for u, start in enumerate(range(0, len(order), 4)):
    group = order[start:start + 4]
    rows, plens = [agreement[j] for j in group], [lens[j] for j in group]
    steps = []
    dyn = sim.run_unit(ctl, rows, plens, list(range(4 * u, 4 * u + 4)), [64] * 4, profile, trace=steps)
    s1, k0 = (sim.run_unit(sim.static_controller(k), rows, plens, [0, 1, 2, 3], [64] * 4, profile) for k in (1, 0))
    print(f"{u:2d} dynamic {dyn:4.0f} ms, static-1 {s1:4.0f}, K=0 {k0:4.0f}; K {''.join(str(k) for k, _, _ in steps)}")
    print(f"   m {' '.join(''.join(str(min(x, 9)) for x in r[:24]) for r in rows)}")
