"""Compile time of step(K, B) with features stubbed out: ABLATE=pen,bad,lists,filter,noise (any of them)."""
import sys, time, os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax, jax.numpy as jnp
from dsd_jax import models, penalties, bad_words, sampling
ab = set(filter(None, os.environ.get("ABLATE", "").split(",")))
if "pen" in ab:
    penalties.penalised_logits = lambda logits, *a: logits.astype(jnp.float32)
    penalties.penalised_draft_logits = lambda logits, *a: logits.astype(jnp.float32)
if "bad" in ab:
    def nobad(bad, active, tokens, pl, length, drafts, before):
        return jnp.full(before.shape + (1,), -1, jnp.int32)
    bad_words.banned_by_bad_words = nobad
if "lists" in ab:
    sampling.allowed_logits = lambda l, *a: l.astype(jnp.float32)
    sampling.biased_logits = lambda l, *a: l.astype(jnp.float32)
if "filter" in ab:
    sampling.filter_logits = lambda l, *a: l
if "noise" in ab:
    sampling.noise_if_sampling = lambda t, make: jnp.zeros(jax.eval_shape(make).shape, jnp.float32)
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
target, draft, tok = models.builtin()
e = SpecEngine(target, draft, SpecConfig(method=os.environ.get("METHOD", "draft_model"), num_speculative_tokens=3),
               max_seq_len=160, max_batch_size=1, tokenizer=tok)
p = e.programs
k, b = map(int, sys.argv[1:3])
ts = []
for r in range(2):
    with p._tracing():
        low = p._lower_step(k, b)
    t = time.perf_counter(); exe = low.compile(); ts.append(time.perf_counter() - t)
n = sum(1 for l in exe.as_text().splitlines() if " = " in l)
print(f"ABLATE={sorted(ab)} K={k} B={b}: compile {min(ts):.2f} s (of {', '.join(f'{t:.2f}' for t in ts)}), {n} instrs")
