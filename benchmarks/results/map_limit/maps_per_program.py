import os, time
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from dsd_jax import models
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
def maps(): return sum(1 for _ in open("/proc/self/maps"))
target, draft, tok = models.builtin()
print("start maps", maps())
e = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=3), max_seq_len=160,
               max_batch_size=16, batch_buckets=(1, 16), prefill_chunk=32, tokenizer=tok)
print("engine maps", maps())
p = e.programs
for k in range(4):
    p.step(k, 16); print("step", k, 16, "maps", maps(), flush=True)
p.prefill(16, 32); print("prefill maps", maps())
