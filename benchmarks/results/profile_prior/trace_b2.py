"""Where dynamic loses to static-3 at B=2 (bench_full_s19, profile_prior/ab): every step of
the sweep's B=2 calls traced (`EngineStats.trace`), dynamic and static-3 on the same fresh
prompt groups, and each call's wall time split into its first dispatch (after the prefill),
its K=0 steps and the rest.

    python benchmarks/results/profile_prior/trace_b2.py > trace_b2.log
"""

import collections
import json
import statistics

from dsd_jax import bench
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile

CONFIGS = ["vanilla", "static-3", "dynamic"]
SLOW_MS = 20.0  # a B=2 step takes 3-9 ms
calls = collections.defaultdict(list)  # config -> per call: [(k, wall_ms, after_prefill, emitted, rounds_in_step)]


def hook(runner):
    run = runner.run

    def traced(config, prompts, sampling):
        out = run(config, prompts, sampling)  # it resets the engine's stats first
        if len(prompts) == 2 and not isinstance(sampling, list):  # the timed B=2 sweep calls
            calls[config].append([(s["k"], s["wall_ms"], s["after_prefill"], s["emitted"])
                                  for s in runner.engine_for(config).stats.trace])
        return out

    runner.run = traced


def main():
    target, draft, tokenizer = builtin()
    prof = Profile.load("benchmarks/results/bench_full_s19.profile.json")
    bench.run_bench(target, draft, tokenizer, heldout_prompts(64 + 16), batch_sizes=[2], configs=CONFIGS,
                    repeats=6, rows_per_point=8, batch_buckets=[1, 2], workloads=("sweep",), profile=prof,
                    runner_hook=hook, log=None)
    with open("benchmarks/results/profile_prior/trace_b2.json", "w") as f:
        json.dump(calls, f)
    for c in CONFIGS:
        per = calls[c]
        total = [sum(w for _, w, _, _ in steps) for steps in per]
        first = [sum(w for _, w, a, _ in steps if a) for steps in per]
        k0 = [sum(w for k, w, a, _ in steps if k == 0 and not a) for steps in per]
        n_steps = [len(steps) for steps in per]
        n_k0 = [sum(1 for k, _, a, _ in steps if k == 0 and not a) for steps in per]
        ks = collections.Counter(k for steps in per for k, _, a, _ in steps if not a)
        first_k = collections.Counter(k for steps in per for k, _, a, _ in steps if a)
        print(f"{c}: {len(per)} calls; per call (median): steps {statistics.median(n_steps)}, "
              f"wall {statistics.median(total):.1f} ms, first dispatch {statistics.median(first):.1f} ms "
              f"(K {dict(first_k)}), K=0 steps {statistics.median(n_k0)} taking {statistics.median(k0):.1f} ms; "
              f"other steps' K {dict(sorted(ks.items()))}")
        slow = [[(k, round(w)) for k, w, a, _ in steps if not a and w > SLOW_MS] for steps in per]
        print(f"   steps over {SLOW_MS} ms (not after a prefill) in each call: {slow}")
        for i in (0, 1):
            print("   call", i, [(k, round(w, 1), int(a), e) for k, w, a, e in per[i]])


if __name__ == "__main__":
    main()
