"""Paired B=1 greedy, method none: floor vs engine at max_seq_len 256 and 4096 (one process)."""
import time, statistics, sys
import numpy as np
from dsd_jax import models
from dsd_jax.bench.side_by_side import make_floor, builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams
REPS = int(sys.argv[1])
target, draft, tok = models.builtin()
prompts, _ = builtin_prompts(4, 0, tok)
prompts = [p[:64] for p in prompts]
floor = make_floor(target, 64)
mk = lambda S: SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=1, max_seq_len=S,
                          tokenizer=tok, batch_buckets=[1])
a = mk(256); a.warmup()
b = mk(4096); b.warmup()
N = 128
sp = SamplingParams(temperature=0.0, max_tokens=N)
fns = {"floor": lambda p: floor([p], N)[0], "S256": lambda p: a.generate([p], sp)[0].token_ids,
       "S4096": lambda p: b.generate([p], sp)[0].token_ids}
for p in prompts:
    for f in fns.values(): f(p)
t = {k: [] for k in fns}
order = list(fns)
for rep in range(REPS):
    for i, p in enumerate(prompts):
        outs = {}
        for k in order[(rep + i) % 3:] + order[:(rep + i) % 3]:
            t0 = time.perf_counter(); outs[k] = fns[k](p); t[k].append(time.perf_counter() - t0)
        assert outs["floor"] == outs["S256"] == outs["S4096"]
def boot(x, y, n=2000):
    r = np.array(x) / np.array(y); rng = np.random.default_rng(0)
    m = [np.median(r[rng.integers(0, len(r), len(r))]) for _ in range(n)]
    return round(float(np.median(r)), 4), np.percentile(m, [2.5, 97.5]).round(4).tolist()
print(f"B=1 128 tokens, {len(t['floor'])} paired calls; medians ms", {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()})
print("engine S=256 speed / floor", boot(t["floor"], t["S256"]))
print("engine S=4096 speed / floor", boot(t["floor"], t["S4096"]))
print("engine S=4096 speed / S=256", boot(t["S256"], t["S4096"]))
