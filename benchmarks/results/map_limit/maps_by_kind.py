import os, collections
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from dsd_jax import models
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
def snap(): return [l.split() for l in open("/proc/self/maps")]
target, draft, tok = models.builtin()
e = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=3), max_seq_len=160,
               max_batch_size=16, batch_buckets=(16,), prefill_chunk=32, tokenizer=tok)
before = {tuple(x[:1]) for x in snap()}
e.programs.step(3, 16)
new = [x for x in snap() if tuple(x[:1]) not in before]
c = collections.Counter((x[1], x[5] if len(x) > 5 else "anon") for x in new)
print(len(new), c.most_common(8))
sizes = collections.Counter()
for x in new:
    a, b = (int(v, 16) for v in x[0].split("-")); sizes[(b - a) // 4096] += 1
print(sorted(sizes.items())[:10])
