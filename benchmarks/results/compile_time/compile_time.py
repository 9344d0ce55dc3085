"""Per-program compile time of the demo's draft_model engine (built-in pair, max_seq_len 160,
K 0..3, buckets 1,4,16,64). Usage: python compile_time.py [K,B ...]; REPEAT=n."""
import sys, time, os, re
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
from dsd_jax import models
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
target, draft, tok = models.builtin()
method = os.environ.get("METHOD", "draft_model")
e = SpecEngine(target, draft, SpecConfig(method=method, num_speculative_tokens=3), max_seq_len=160,
               max_batch_size=64, batch_buckets=(1, 4, 16, 64), tokenizer=tok)
p = e.programs
pairs = [tuple(map(int, a.split(","))) for a in sys.argv[1:]] or [(0, 1), (1, 1), (3, 1), (3, 64)]
rep = int(os.environ.get("REPEAT", "2"))
tot = 0.0
for k, b in pairs:
    for r in range(rep):
        t0 = time.perf_counter()
        with p._tracing():
            low = p._lower_step(k, b)
        t1 = time.perf_counter()
        exe = low.compile()
        t2 = time.perf_counter()
        n = sum(1 for l in exe.as_text().splitlines() if " = " in l)
        print(f"step K={k} B={b}: lower {t1-t0:.2f} s compile {t2-t1:.2f} s, {n} HLO instrs", flush=True)
        if r == rep - 1: tot += t2 - t0
print(f"total (last repeat) {tot:.1f} s")
