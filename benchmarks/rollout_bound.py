"""How much can any K policy gain on the bench's rollout? A simulation from measured numbers.

    python benchmarks/rollout_bound.py benchmarks/results/bench_full_s5.json [PROFILE.json]

Reads a `dsd-jax bench --json` result (the rollout's output lengths and, from the
sweep's static-K rows, the measured mean accepted length AL(K) per step) and a
profile (step latency ITL(B, K); default: the JSON's ``.profile.json`` sibling). It
then replays the rollout's decode phase step by step: the live batch is the number
of unfinished requests, each step costs ITL(bucket, K) and advances every live
request by AL(K) tokens. Printed: the decode time of every static K and of the
per-batch-size best K (the goodput argmax with *true* acceptance, so an upper bound
for a controller that must estimate it), next to the measured makespans. Prefill
is the same work for every configuration, so it dilutes any decode gain.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from dsd_jax.profile import Profile


def measured_al(rows: list[dict]) -> dict[int, float]:
    """AL(K) for each static K: tokens per row-step over the sweep, pooled over batch sizes."""
    per_k: dict[int, list[float]] = {}
    for r in rows:
        if r.get("workload") == "sweep" and r["config"].startswith("static-") and r.get("mean_accepted_len"):
            per_k.setdefault(int(r["config"].split("-")[1]), []).append(r["mean_accepted_len"])
    return {0: 1.0, **{k: float(np.median(v)) for k, v in per_k.items()}}


def simulate(lengths, itl_ms, buckets, al: dict[int, float], policy) -> float:
    """Seconds of decode for `lengths` with K = policy(bucket index) at every step."""
    remaining = np.array(lengths, float)
    t = 0.0
    while (remaining > 0).any():
        live = int((remaining > 0).sum())
        bi = next(i for i, b in enumerate(buckets) if b >= live)
        k = policy(bi)
        t += itl_ms[bi, k]
        remaining[remaining > 0] -= al[k]
    return t / 1e3


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__)
        return 2
    data = json.loads(Path(argv[0]).read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    prof_path = Path(argv[1]) if len(argv) > 1 else Path(argv[0]).with_suffix(".profile.json")
    profile = Profile.load(prof_path)
    meta = next(r for r in rows if r.get("workload") == "meta")
    lengths = meta["rollout"]["lengths"]
    units = lengths if lengths and isinstance(lengths[0], list) else [lengths]  # one list per rollout (since s19)
    ctx = profile.context_lengths[0]
    buckets = list(profile.batch_sizes)
    al = measured_al(rows)
    ks = sorted(k for k in al if k in profile.ks)
    itl = np.full((len(buckets), max(ks) + 1), np.inf)
    for bi, b in enumerate(buckets):
        for k in ks:
            itl[bi, k] = profile.itl_ms(b, k, ctx)
    al_vec = np.array([al.get(k, 0.0) for k in range(max(ks) + 1)])
    best_k = [int(np.argmax(al_vec / itl[bi])) for bi in range(len(buckets))]
    def mean_over_rollouts(policy):  # as the bench's makespan_s, a rollout's mean
        return float(np.mean([simulate(unit, itl, buckets, al, policy) for unit in units]))
    static = {k: mean_over_rollouts(lambda bi, k=k: k) for k in ks}
    oracle = mean_over_rollouts(lambda bi: best_k[bi])
    measured = {r["config"]: r["makespan_s"] for r in rows if r.get("workload") == "rollout"}
    print("AL(K) measured in the sweep: " + ", ".join(f"K{k} {al[k]:.2f}" for k in ks))
    print("best K per batch bucket with true acceptance: "
          + ", ".join(f"B{b}: K{k}" for b, k in zip(buckets, best_k)))
    print("simulated decode seconds (measured makespan, prefill included):")
    for k in ks:
        name = "vanilla" if k == 0 else f"static-{k}"
        print(f"  {name:>9}: {static[k]:6.2f} s   ({measured.get(name, float('nan')):.2f} s)")
    print(f"  {'best-K':>9}: {oracle:6.2f} s   (dynamic: {measured.get('dynamic', float('nan')):.2f} s)")
    best_static = min(static.values())
    print(f"best-K decode / best static decode = {oracle / best_static:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
