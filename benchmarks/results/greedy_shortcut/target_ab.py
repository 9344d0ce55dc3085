"""Paired B=1 greedy: floor vs engine (old step tail) vs engine (greedy shortcut)."""
import time, statistics, sys, importlib.util
import numpy as np
import jax
from dsd_jax import models
import dsd_jax.step as step_mod
from dsd_jax.bench.side_by_side import make_floor, builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams
spec = importlib.util.spec_from_file_location("old_step", sys.argv[4] if len(sys.argv) > 4 else "/tmp/old_step.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_step"] = old; spec.loader.exec_module(old)
import dsd_jax.step as _s
old.StepOutput = _s.StepOutput

S = int(sys.argv[1]); REPS = int(sys.argv[2]); METHOD = sys.argv[3] if len(sys.argv) > 3 else "none"
target, draft, tok = models.builtin()
prompts, _ = builtin_prompts(4, 0, tok)
prompts = [p[:64] for p in prompts]
floor = make_floor(target, 64)
mk = lambda: SpecEngine(target, draft if METHOD != "none" else None, SpecConfig(method=METHOD), max_batch_size=1,
                        max_seq_len=S, tokenizer=tok, batch_buckets=[1])
new_fn = step_mod.spec_step
step_mod.spec_step = old.spec_step
a = mk(); a.warmup()
step_mod.spec_step = new_fn
b = mk(); b.warmup()
N = 128
sp = SamplingParams(temperature=0.0, max_tokens=N)
fns = {"floor": lambda p: floor([p], N)[0], "old": lambda p: a.generate([p], sp)[0].token_ids,
       "new": lambda p: b.generate([p], sp)[0].token_ids}
for p in prompts:
    for f in fns.values(): f(p)
t = {k: [] for k in fns}
order = list(fns)
for rep in range(REPS):
    for i, p in enumerate(prompts):
        outs = {}
        for k in order[(rep + i) % 3:] + order[:(rep + i) % 3]:
            t0 = time.perf_counter(); outs[k] = fns[k](p); t[k].append(time.perf_counter() - t0)
        assert outs["floor"] == outs["old"] == outs["new"]
def boot(x, y, n=2000):
    r = np.array(x) / np.array(y); rng = np.random.default_rng(0)
    m = [np.median(r[rng.integers(0, len(r), len(r))]) for _ in range(n)]
    return round(float(np.median(r)), 4), np.percentile(m, [2.5, 97.5]).round(4).tolist()
print(f"S={S} method={METHOD} medians ms", {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()})
print("old speed / floor", boot(t["floor"], t["old"]))
print("new speed / floor", boot(t["floor"], t["new"]))
print("new speed / old", boot(t["old"], t["new"]))
