"""Does the bench's 16-prompt acceptance prior decide dynamic at B=2 and B=4?

bench_full_s19 profiled acceptance on held-out prompts 384-399 (a_1 0.70, a_2 0.43) where
s18 had used prompts 192-207 (a_1 0.81, a_2 0.66), and dynamic fell to 0.93x the best
static K at B=2. This runs the sweep at B=2 and 4 (vanilla, static-1, static-3 and the
dynamic configurations given) with each profile in turn, one `run_bench` per profile: the
paired dynamic / best-static ratios within each run show whether the prior moves them.

    python benchmarks/results/profile_prior/ab.py s18 s19 s18 s19 > ab.log
    python benchmarks/results/profile_prior/ab.py --dynamic dynamic,dynamic-throughput --out objective.json s19 s19
"""

import argparse
import json

from dsd_jax import bench
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile

ROOT = "benchmarks/results"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="+", help="bench_full_<NAME>.profile.json names, run in turn")
    ap.add_argument("--dynamic", default="dynamic", help="dynamic configurations, comma-separated")
    ap.add_argument("--out", default="ab.json")
    args = ap.parse_args(argv)
    dynamic = args.dynamic.split(",")
    target, draft, tokenizer = builtin()
    prompts = heldout_prompts(64 + 16)
    out = {}
    for i, name in enumerate(args.profiles):
        prof = Profile.load(f"{ROOT}/bench_full_{name}.profile.json")
        rows = bench.run_bench(target, draft, tokenizer, prompts, batch_sizes=[2, 4],
                               configs=["vanilla", "static-1", "static-3"] + dynamic, repeats=6,
                               rows_per_point=8, batch_buckets=[1, 2, 4], workloads=("sweep",),
                               profile=prof, log=None)
        for r in rows:
            if r["workload"] == "sweep" and r["config"] in dynamic:
                key = f"{i}:{name}:{r['config']}:B={r['batch_size']}"
                out[key] = {"vs_best_static": r["vs_best_static"], "best_static": r["best_static"],
                            "vs_vanilla": r["vs_vanilla"], "k_hist": r["k_hist"]}
                v = r["vs_best_static"]
                print(f"{key}: / {r['best_static']} {v['ratio']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}] "
                      f"(n={v['n']}), K {r['k_hist']}", flush=True)
    with open(f"{ROOT}/profile_prior/{args.out}", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
