"""Paired ratio of two configurations of one bench JSON, per point (median of the per-unit
ratios, 95% bootstrap interval).

    python pair.py bench_ab.json dynamic dynamic-throughput
"""
import json
import sys

import numpy as np


def boot(r, n=4000):
    rng = np.random.default_rng(0)
    return np.percentile([np.median(r[rng.integers(0, len(r), len(r))]) for _ in range(n)], [2.5, 97.5])


path, new, old = sys.argv[1:4]
rows = [r for r in json.load(open(path))["rows"] if "tokens_per_s_pairs" in r]
by = {(r["workload"], r.get("batch_size"), r["config"]): r for r in rows}
for w, b, c in sorted({k for k in by if k[2] == new}, key=lambda k: (k[0], k[1] or 0)):
    r = np.array(by[w, b, new]["tokens_per_s_pairs"]) / np.array(by[w, b, old]["tokens_per_s_pairs"])
    lo, hi = boot(r)
    print(f"{w} B={b}: {new} / {old} {np.median(r):.3f} [{lo:.3f}, {hi:.3f}] (n={len(r)})")
