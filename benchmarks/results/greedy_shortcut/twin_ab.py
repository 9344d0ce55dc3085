"""Two identical engines in one process, paired and interleaved: how far apart can two
instances of the same configuration run? (The floor of what a paired bench resolves.)

    python benchmarks/results/greedy_shortcut/twin_ab.py B REPS
"""
import statistics
import sys
import time

import numpy as np

from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams

B, REPS = int(sys.argv[1]), int(sys.argv[2])
target, draft, tok = models.builtin()
prompts, _ = builtin_prompts(2 * B, 0, tok)
groups = [[p[:64] for p in prompts[i * B:(i + 1) * B]] for i in range(2)]
engines = {}
for name in ("a", "b"):
    engines[name] = SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=B, max_seq_len=256,
                               tokenizer=tok, batch_buckets=[B])
    engines[name].warmup()
sp = SamplingParams(temperature=0.0, max_tokens=64)
t = {k: [] for k in engines}
for rep in range(REPS + 1):
    for i, g in enumerate(groups):
        order = ["a", "b"] if (rep + i) % 2 == 0 else ["b", "a"]
        outs = {}
        for k in order:
            t0 = time.perf_counter()
            outs[k] = [o.token_ids for o in engines[k].generate(g, sp)]
            if rep:
                t[k].append(time.perf_counter() - t0)
        assert outs["a"] == outs["b"]
r = np.array(t["a"]) / np.array(t["b"])
rng = np.random.default_rng(0)
boot = [np.median(r[rng.integers(0, len(r), len(r))]) for _ in range(4000)]
print(f"B={B}: {len(r)} pairs, medians ms a {statistics.median(t['a']) * 1e3:.1f} b {statistics.median(t['b']) * 1e3:.1f}; "
      f"speed b / a {np.median(r):.4f} {np.percentile(boot, [2.5, 97.5]).round(4).tolist()}")
