"""Step time per (batch bucket, K) of the built-in pair, from the library's own profiler.

    python benchmarks/step_times.py --max-seq-len 2048 --out step_times.json

Runs `dsd_jax.profiler.profile_engine` (interleaved Ks, medians) on an engine with
`max_seq_len` slots and writes the ITL table, the measured acceptance and, per batch
bucket, the goodput AL(K) / ITL(B, K) relative to K = 0 (AL(K) = 1 + a_1 + ... + a_K, the
controller's model) with the K that maximises it: where that K is 0, speculation stops
paying. Run it on two checkouts to compare step times before and after a change at the
same settings.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from dsd_jax import SpecConfig, SpecEngine, models
from dsd_jax.profiler import profile_engine


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--batch-buckets", default="1,8,64")
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    buckets = tuple(int(b) for b in args.batch_buckets.split(","))
    target, draft, _ = models.builtin()
    engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=args.max_k),
                        max_batch_size=buckets[-1], max_seq_len=args.max_seq_len, batch_buckets=buckets)
    prof = profile_engine(engine, context_lengths=(args.context,), repeats=args.repeats,
                          warmup_reps=1, acceptance_max_tokens=8)
    table = {f"B={b}": {f"K={k}": round(prof.itl_ms(b, k), 2) for k in range(args.max_k + 1)}
             for b in buckets}
    accepted_length = np.concatenate([[1.0], 1.0 + np.cumsum(prof.acceptance)])  # AL(0..max_k)
    goodput = {}
    for b in buckets:
        g = accepted_length / np.array([prof.itl_ms(b, k) for k in range(args.max_k + 1)])
        goodput[f"B={b}"] = {**{f"K={k}": round(float(g[k] / g[0]), 3) for k in range(args.max_k + 1)},
                             "best_k": int(np.argmax(g))}
    result = dict(max_seq_len=args.max_seq_len, context=args.context, jax=jax.__version__,
                  itl_ms=table, acceptance=[round(a, 3) for a in prof.acceptance],
                  goodput_vs_k0=goodput)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
