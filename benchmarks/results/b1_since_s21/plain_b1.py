"""Plain decoding at B=1 on the built-in pair's target, the full bench's shapes (max_seq_len 448,
buckets 1..64, 64 greedy tokens a request): tokens/s of one engine over 8 held-out prompts
run one at a time, after warmup. Run it on two checkouts (PYTHONPATH) in alternation to
tell a library change from the machine's day:

    for r in 1 2 3; do for v in OLD NEW; do PYTHONPATH=$v python plain_b1.py $v; done; done
"""
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402

import dsd_jax as dsd  # noqa: E402
from dsd_jax import models  # noqa: E402

target, _, tok = models.builtin()
engine = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), max_batch_size=64,
                        batch_buckets=(1, 2, 4, 8, 16, 32, 64), max_seq_len=448, tokenizer=tok)
engine.warmup()
prompts = models.heldout_prompts(8, seed=5)
sp = dsd.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
engine.generate(prompts[:1], sp)  # one more untimed call
rates = []
for p in prompts:
    t0 = time.perf_counter()
    out = engine.generate([p], sp)[0]
    rates.append(len(out.token_ids) / (time.perf_counter() - t0))
label = sys.argv[1] if len(sys.argv) > 1 else ""
print(f"{label} plain B=1: median {np.median(rates):.1f} tok/s (min {min(rates):.1f}, max {max(rates):.1f})", flush=True)
