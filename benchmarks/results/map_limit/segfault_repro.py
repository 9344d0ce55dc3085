"""Compiles the built-in pair's steps K 0..3 one by one, printing the maps held after each. With the
system's cap lowered (as root: echo 3000 > /proc/sys/vm/max_map_count; put it back after), the third
compile killed Python with exit code 139 on 2026-11-30, before `dsd_jax.map_budget` existed
(now `MapBudget.check` stands in the way: patch it to return None to see the crash)."""
import os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from dsd_jax import models
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
def maps(): return sum(1 for _ in open("/proc/self/maps"))
target, draft, tok = models.builtin()
e = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=3), max_seq_len=160,
               max_batch_size=16, batch_buckets=(16,), prefill_chunk=32, tokenizer=tok)
try:
    for k in range(4):
        e.programs.step(k, 16); print("step", k, "maps", maps(), flush=True)
except BaseException as err:
    print("raised", type(err).__name__, str(err)[:300], flush=True)
print("alive", flush=True)
