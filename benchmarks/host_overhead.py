"""How long the device sits idle between steps because of the host loop.

    python benchmarks/host_overhead.py [--tokens 400] [--repeats 5]

Method: for K = 0 and K = 2 (fixed), generate N tokens for one request (B = 1) through
the engine and take its wall time per decode step W from the engine's trace (prefill
excluded: from the first step's result on). The device's own time per step D is the
profiler's ITL(1, K) at the request's mean context (`dsd_jax.profiler.profile_engine`:
the same compiled program back to back, several rounds a dispatch as the engine runs
them). The idle fraction is 1 - D / W: the share of the engine's wall time the device
waited on Python (admission, controller, reading tokens back, bookkeeping).
"""

from __future__ import annotations

import argparse

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models
from dsd_jax.profiler import profile_engine


class _Fixed:
    """A controller that always answers K."""

    def __init__(self, k):
        self.k = k

    def choose_k(self, *a, **kw):
        return self.k

    def observe(self, *a, **kw):
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=400, help="tokens generated per run (default 400)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per K, and profiler repeats (default 5)")
    args = ap.parse_args(argv)
    cfg = models.ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=16)
    target, draft = models.init_model(cfg, 0), models.init_model(cfg.replace(num_layers=1), 1)
    prompt = [1, 2, 3]
    context = len(prompt) + args.tokens // 2
    print(" K | engine ms/step | device ms/step | idle fraction")
    for k in (0, 2):
        engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=2), max_batch_size=1,
                            max_seq_len=args.tokens * 4 + 8, controller=_Fixed(k))
        engine.warmup()
        walls = []
        for _ in range(args.repeats):
            engine.stats.reset()
            engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=args.tokens))
            decode = [t for t in engine.stats.trace if not t["after_prefill"]]  # gaps between results
            walls.append(sum(t["wall_ms"] for t in decode) / len(decode))
        prof = profile_engine(engine, context_lengths=(context,), repeats=args.repeats, acceptance_max_tokens=4)
        w, d = float(np.median(walls)), prof.itl_ms(1, k, context)
        print(f"{k:2d} | {w:14.3f} | {d:14.3f} | {max(0.0, 1 - d / w):.3f}")


if __name__ == "__main__":
    main()
