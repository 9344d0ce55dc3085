"""The target's top-2 logit gaps along vanilla's greedy completions of the 576 prompts the
bench's B=32 point ran (18 groups of 32): near-ties that another program's rounding can swap."""
import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np
import jax, jax.numpy as jnp
from flax import nnx
import dsd_jax as dsd
from dsd_jax import models
from dsd_jax.bench.commands import _prompts_needed
from dsd_jax.loading import encode_prompts

target, draft, tok = models.builtin()
n = _prompts_needed(False, [1, 2, 4, 8, 16, 32, 64])
ids = [p[:128] for p in encode_prompts(models.heldout_prompts(n), tok, target.config.vocab_size)]
van = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), max_batch_size=64, max_seq_len=448,
                     tokenizer=tok, prefill_chunk=128)
sp = dsd.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
outs = []
for g in range(18):
    outs += [o.token_ids for o in van.generate(ids[g * 32:(g + 1) * 32], sp)]
graph, params = nnx.split(target)
cfg = target.config
L = 256

@jax.jit
def all_logits(params, tokens):  # [B, L] -> top-2 of every position's logits
    pos = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), tokens.shape)
    logits, _ = models.forward(graph, params, tokens, pos, models.init_kv_cache(cfg, tokens.shape[0], L),
                               attn_backend="xla")
    return jax.lax.top_k(logits, 2)

rows = []
for s in range(0, len(outs), 16):
    batch = np.zeros((16, L), np.int32)
    lens = []
    for r in range(16):
        seq = ids[s + r] + outs[s + r]
        batch[r, :len(seq)] = seq
        lens.append((len(ids[s + r]), len(seq)))
    vals, idx = (np.asarray(x) for x in all_logits(params, jnp.asarray(batch)))
    for r, (p, end) in enumerate(lens):
        for t in range(p - 1, end - 1):  # logits at t predict token t + 1 (completion index t + 1 - p)
            rows.append((s + r, t + 1 - p, float(vals[r, t, 0] - vals[r, t, 1]), float(vals[r, t, 0]),
                         int(idx[r, t, 0]) == outs[s + r][t + 1 - p]))
gaps = np.array([g for _, _, g, _, _ in rows])
agree = np.mean([a for *_, a in rows])
print(f"{len(rows)} positions; full forward's argmax = vanilla's token at {agree:.5f} of them")
for thr in (1e-6, 1e-5, 1e-4, 1e-3):
    print(f"gap < {thr:g}: {(gaps < thr).sum()}")
for prompt, j, gap, top, ok in sorted(rows, key=lambda x: x[2])[:10]:
    print(f"prompt {prompt} (group {prompt // 32} row {prompt % 32}) token {j}: top-2 gap {gap:.3g} at top logit {top:.4f}; argmax agrees {ok}")
