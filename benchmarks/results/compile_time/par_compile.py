"""Serial vs threaded compile of the demo engine's step programs (lowered first, serially)."""
import sys, time, os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from concurrent.futures import ThreadPoolExecutor
import jax
from dsd_jax import models
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
target, draft, tok = models.builtin()
e = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=3), max_seq_len=160,
               max_batch_size=64, batch_buckets=(1, 4, 16, 64), tokenizer=tok)
p = e.programs
keys = [(k, b) for b in (1, 16) for k in range(4)]
workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
for mode in ("serial", "threads", "serial", "threads"):
    t0 = time.perf_counter()
    with p._tracing():
        lows = [p._lower_step(k, b) for k, b in keys]
    t1 = time.perf_counter()
    if mode == "serial":
        exes = [l.compile() for l in lows]
    else:
        with ThreadPoolExecutor(workers) as pool:
            exes = list(pool.map(lambda l: l.compile(), lows))
    t2 = time.perf_counter()
    print(f"{mode}: lower {t1-t0:.1f} s, compile {t2-t1:.1f} s ({len(keys)} programs)", flush=True)
