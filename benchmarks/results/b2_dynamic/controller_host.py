"""The goodput controller's host time a round at B=2 (makespan objective, 64 slots, buckets
1-64, bench_full_s28's profile), on simulated 64-token calls of 2 requests: fresh, or after
300 calls at B=1 (`after_b1`), as the full bench reaches B=2. `--prof` adds a cProfile.

    python benchmarks/results/b2_dynamic/controller_host.py [b2|after_b1] [--prof]
"""
import cProfile, pstats, time, sys
import numpy as np
from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.profile import Profile

prof = Profile.load("benchmarks/results/bench_full_s28.profile.json")
spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))
c = Controller(spec, prof, 64, batch_buckets=[1, 2, 4, 8, 16, 32, 64])
rng = np.random.default_rng(0)
ttot = {"choose": 0.0, "observe": 0.0, "forget": 0.0}; n = 0

def run_call(b, rid0):
    global n
    ids = [f"r{rid0+i}" for i in range(b)]
    rem = [64] * b
    ctx = 100
    while max(rem) > 0:
        live = [i for i in range(b) if rem[i] > 0]
        t0 = time.perf_counter()
        k = c.choose_k(len(live), context_len=ctx, request_ids=[ids[i] for i in live], remaining=[rem[i] for i in live])
        t1 = time.perf_counter()
        acc = np.minimum(rng.geometric(0.35, len(live)) - 1, k)
        c.observe(k, acc, step_time_s=0.012, request_ids=[ids[i] for i in live], context_len=ctx, batch_size=2)
        t2 = time.perf_counter()
        ttot["choose"] += t1 - t0; ttot["observe"] += t2 - t1; n += 1
        for j, i in enumerate(live):
            rem[i] = max(0, rem[i] - int(acc[j]) - 1)
            if rem[i] == 0:
                t3 = time.perf_counter(); c.forget_request(ids[i]); ttot["forget"] += time.perf_counter() - t3
        ctx += 3

rid = 0
mode = sys.argv[1] if len(sys.argv) > 1 else "b2"
if mode == "after_b1":
    for _ in range(300):
        run_call(1, rid); rid += 1
for key in ttot: ttot[key] = 0.0
n = 0
pr = cProfile.Profile()
if "--prof" in sys.argv: pr.enable()
for _ in range(100):
    run_call(2, rid); rid += 2
pr.disable()
print(mode, n, "steps; per step us:", {k: round(v / n * 1e6, 1) for k, v in ttot.items()})
if "--prof" in sys.argv: pstats.Stats(pr).sort_stats("cumtime").print_stats("dsd_jax", 30)
