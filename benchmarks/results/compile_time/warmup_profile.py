"""The built-in pair's draft_model engine (K 0..3, buckets 1, 4, 16, 64, max_seq_len 160, the default
prefill_chunk 256: five chunk buckets; the demo uses 32) warmed up, each program timed (trace + lower + compile)."""
import collections, os, sys, time
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
from dsd_jax import models
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
target, draft, tok = models.builtin()
method = os.environ.get("METHOD", "draft_model")
e = SpecEngine(target, draft if method == "draft_model" else None,
               SpecConfig(method=method, num_speculative_tokens=int(os.environ.get("K", 3))),
               max_seq_len=160, max_batch_size=64, batch_buckets=(1, 4, 16, 64), tokenizer=tok)
p = e.programs
orig = type(p)._get
times = {}
def timed(self, key, lower):
    t = time.perf_counter(); out = orig(self, key, lower)
    times.setdefault(key, time.perf_counter() - t); return out
type(p)._get = timed
t0 = time.perf_counter(); n = e.warmup(); wall = time.perf_counter() - t0
kind = collections.defaultdict(list)
for k, t in times.items(): kind[k[0]].append((t, k[1:]))
print(f"{method} K=0..{e.max_k}: warmup {n} programs in {wall:.1f} s")
for name, ts in sorted(kind.items(), key=lambda kv: -sum(t for t, _ in kv[1])):
    print(f"  {name}: {len(ts)} programs, {sum(t for t, _ in ts):.1f} s: " +
          ", ".join(f"{args}={t:.1f}" for t, args in sorted(ts, key=lambda x: x[1])))
