"""Where dynamic holds K=0 at B=4 (bench_full_s21: K=0 with all four rows live in 213 steps,
s20 53; 0.94x [0.90, 0.98]* of static-1). The sweep at B=1, 2 and 4 as the bench runs it
(one controller through the points in turn, s21's profile), every B=4 call of dynamic
traced: its K per step and rows emitted, and at the call's start the c_1 a fresh row takes
(`RequestAcceptance.shrink_target`) and the global conditional rates.

    python benchmarks/results/b4_k0/trace_b4.py > benchmarks/results/b4_k0/trace_b4.log
"""

import numpy as np

from dsd_jax import bench
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile

CONFIGS = ["vanilla", "static-1", "dynamic"]


def hook(runner):
    run = runner.run

    def traced(config, prompts, sampling):
        ctl = runner.controller(config)
        before = None
        if config == "dynamic" and len(prompts) == 4:
            before = (np.round(ctl._requests.shrink_target(), 2), np.round(np.nan_to_num(ctl._acc.rates), 2))
        wall, outs, info = run(config, prompts, sampling)
        if len(prompts) == 4 and not isinstance(sampling, list):
            steps = runner.engine_for(config).stats.trace
            ks = "".join(str(s["k"]) for s in steps)
            line = f"{config:>9} {1e3 * wall:7.1f} ms, {len(steps):3d} steps, K {ks}"
            if before is not None:
                line += f"\n{'':>9} start: target c {before[0]}, global c {before[1]}"
            print(line, flush=True)
        return wall, outs, info

    runner.run = traced


def main():
    target, draft, tokenizer = builtin()
    prof = Profile.load("benchmarks/results/bench_full_s21.profile.json")
    bench.run_bench(target, draft, tokenizer, heldout_prompts(64 + 16), batch_sizes=[1, 2, 4], configs=CONFIGS,
                    repeats=6, rows_per_point=8, batch_buckets=[1, 2, 4], workloads=("sweep",), profile=prof,
                    runner_hook=hook, log=None)


if __name__ == "__main__":
    main()
