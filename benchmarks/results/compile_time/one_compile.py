"""Compiles step(K, B) of the built-in pair's draft_model engine once (for XLA's logs): python one_compile.py K B."""
import sys, time, os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
from dsd_jax import models
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
target, draft, tok = models.builtin()
e = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=3), max_seq_len=160,
               max_batch_size=64, batch_buckets=(1, 4, 16, 64), tokenizer=tok)
p = e.programs
k, b = map(int, sys.argv[1:3])
with p._tracing():
    low = p._lower_step(k, b)
t = time.perf_counter(); exe = low.compile(); print("compile", time.perf_counter() - t, file=sys.stderr)
