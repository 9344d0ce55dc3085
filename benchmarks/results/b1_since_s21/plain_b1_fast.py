"""plain_b1.py with two batch buckets (1, 64) so a run compiles less, and 16 prompts, 2 passes.
Run in alternation on two checkouts (PYTHONPATH)."""
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402

import dsd_jax as dsd  # noqa: E402
from dsd_jax import models  # noqa: E402

target, _, tok = models.builtin()
engine = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), max_batch_size=64,
                        batch_buckets=(1, 64), max_seq_len=448, tokenizer=tok)
engine.warmup()
prompts = models.heldout_prompts(16, seed=5)
sp = dsd.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
engine.generate(prompts[:2], sp)  # untimed
rates = []
for _ in range(2):
    for p in prompts:
        t0 = time.perf_counter()
        out = engine.generate([p], sp)[0]
        rates.append(len(out.token_ids) / (time.perf_counter() - t0))
label = sys.argv[1] if len(sys.argv) > 1 else ""
r = np.array(rates)
print(f"{label} plain B=1: median {np.median(r):.1f} mean {r.mean():.1f} tok/s (min {r.min():.1f}, max {r.max():.1f}, n {len(r)})", flush=True)
