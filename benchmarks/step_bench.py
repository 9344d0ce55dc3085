"""Step time per K at B = 1 and B = 32, and tokens per step, for a small model pair.

    python benchmarks/step_bench.py [--identical-draft]

Not a test: prints a table. The draft is a random model unless --identical-draft
(then every draft is accepted and tokens/step is K+1, the upper bound).
"""

from __future__ import annotations

import argparse

import numpy as np

from dsd_jax import SpecConfig, SpecEngine, models
from dsd_jax.profiler import profile_engine


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--identical-draft", action="store_true")
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args()
    cfg = models.ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=4,
                             num_heads=4, num_kv_heads=2, head_dim=32)
    target = models.init_model(cfg, 0)
    draft = target if args.identical_draft else models.init_model(
        cfg.replace(num_layers=1, hidden_size=64, intermediate_size=192, num_heads=2, num_kv_heads=1), 1)
    engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=args.max_k),
                        max_batch_size=32, max_seq_len=args.context + 64, batch_buckets=(1, 32))
    prof = profile_engine(engine, context_lengths=(args.context,), repeats=15,
                          acceptance_max_tokens=32)
    al = np.concatenate([[1.0], 1.0 + np.cumsum(prof.acceptance)])
    print(f"context {args.context}, acceptance a_i = {np.round(prof.acceptance, 3).tolist()}")
    print(" K | tokens/step | B=1 ms  | B=32 ms | B=1 tok/s/row | B=32 tok/s/row")
    for k in prof.ks:
        t1, t32 = prof.itl_ms(1, k), prof.itl_ms(32, k)
        print(f"{k:2d} | {al[k]:11.2f} | {t1:7.2f} | {t32:7.2f} | {al[k] / t1 * 1e3:13.0f} | "
              f"{al[k] / t32 * 1e3:14.0f}")


if __name__ == "__main__":
    main()
