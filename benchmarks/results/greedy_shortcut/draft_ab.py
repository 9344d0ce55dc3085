"""Paired B=1 greedy, static K: engine with the draft-model's old propose tail vs its greedy shortcut."""
import time, statistics, sys, importlib.util
import numpy as np
import jax
from dsd_jax import models
from dsd_jax.drafters import draft_model as dm
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams
spec = importlib.util.spec_from_file_location("old_dm", sys.argv[4] if len(sys.argv) > 4 else "/tmp/old_draft_model.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_dm"] = old; spec.loader.exec_module(old)
K = int(sys.argv[1]); REPS = int(sys.argv[2]); B = int(sys.argv[3]) if len(sys.argv) > 3 else 1
target, draft, tok = models.builtin()
prompts, _ = builtin_prompts(4 * B, 0, tok)
prompts = [p[:64] for p in prompts]
groups = [prompts[i * B:(i + 1) * B] for i in range(4)]
mk = lambda: SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=K),
                        max_batch_size=B, max_seq_len=256, tokenizer=tok, batch_buckets=[B])
new_fn = dm.DraftModel._propose_one
dm.DraftModel._propose_one = old.DraftModel._propose_one
a = mk(); a.warmup()
dm.DraftModel._propose_one = new_fn
b = mk(); b.warmup()
N = 128
sp = SamplingParams(temperature=0.0, max_tokens=N)
fns = {"old": lambda g: [o.token_ids for o in a.generate(g, sp)], "new": lambda g: [o.token_ids for o in b.generate(g, sp)]}
for g in groups:
    for f in fns.values(): f(g)
t = {k: [] for k in fns}
order = list(fns)
for rep in range(REPS):
    for i, g in enumerate(groups):
        outs = {}
        for k in order[(rep + i) % 2:] + order[:(rep + i) % 2]:
            t0 = time.perf_counter(); outs[k] = fns[k](g); t[k].append(time.perf_counter() - t0)
        assert outs["old"] == outs["new"]
def boot(x, y, n=2000):
    r = np.array(x) / np.array(y); rng = np.random.default_rng(0)
    m = [np.median(r[rng.integers(0, len(r), len(r))]) for _ in range(n)]
    return round(float(np.median(r)), 4), np.percentile(m, [2.5, 97.5]).round(4).tolist()
print(f"K={K} B={B} medians ms", {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()})
print("new speed / old", boot(t["old"], t["new"]))
