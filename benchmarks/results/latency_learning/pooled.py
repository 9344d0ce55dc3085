"""Learning / shipped pooled over several bench runs: per point, the geometric mean of the
per-unit tokens/s ratios of `dynamic-throughput` (relabelled learning, `ab.py`) over
`dynamic`, all runs' units together, with a 95% bootstrap that resamples units within
each run (a run's units share its profile and machine state).

    python pooled.py bench_ab.json bench_ab_b2_b4.json bench_ab_all.json ../bench_full_s16.json
"""
import json
import sys
from collections import defaultdict

import numpy as np

NEW, OLD = "dynamic-throughput", "dynamic"


def log_ratios(path):
    rows = [r for r in json.load(open(path))["rows"] if "tokens_per_s_pairs" in r]
    by = {(r["workload"], r.get("batch_size"), r["config"]): r for r in rows}
    out = {}
    for w, b, c in by:
        if c == NEW and (w, b, OLD) in by:
            out[w, b] = np.log(np.array(by[w, b, NEW]["tokens_per_s_pairs"])
                               / np.array(by[w, b, OLD]["tokens_per_s_pairs"]))
    return out


def main(paths, n=4000):
    per_point = defaultdict(list)
    for p in paths:
        for point, r in log_ratios(p).items():
            per_point[point].append(r)
    rng = np.random.default_rng(0)
    for (w, b), runs in sorted(per_point.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        mean = np.concatenate(runs).mean()
        boots = [np.concatenate([r[rng.integers(0, len(r), len(r))] for r in runs]).mean() for _ in range(n)]
        lo, hi = np.exp(np.percentile(boots, [2.5, 97.5]))
        each = " ".join(f"{np.exp(r.mean()):.3f}" for r in runs)
        star = "*" if lo > 1 or hi < 1 else ""
        print(f"{w} B={b}: {np.exp(mean):.3f} [{lo:.3f}, {hi:.3f}]{star} over {len(runs)} runs, "
              f"n={sum(len(r) for r in runs)} (runs: {each})")


if __name__ == "__main__":
    main(sys.argv[1:])
