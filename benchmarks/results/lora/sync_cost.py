"""What a LoRA policy's weight sync costs the rollout engine, against a full sync and the floor.

A Tunix Llama3 of 8 layers (d 1024, MLP 4096, 16 heads of 64, 4 KV heads, vocab 32000: 186M
parameters, float32) with qwix LoRA of rank 16 on all seven projections. Variants, called
in random order within each repeat (per variant: the median of 3 calls; 20 repeats,
paired):
- "lora": `SpecRollout.update_params(adapters, (nnx.LoRAParam,))`, Tunix's LoRA sync: the
  adapters go to the engine's device and one program writes base + (alpha/rank) a.b into
  every adapted leaf (`dsd_jax.lora`);
- "full": a rollout of the same model without LoRA, `update_params(every weight)`: the
  mapping program's copy of every leaf (`dsd_jax.param_mapping`);
- "copy": the floor of the merge's memory traffic, a jitted copy of the adapted leaves
  (read and write each once);
- "products": the floor of its arithmetic, the a.b products alone (2 * rank FLOPs per
  element of the adapted leaves), written out.
Usage: python sync_cost.py [repeats]"""
import random
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import qwix
from flax import nnx
from tunix.models.llama3 import model as llama3
from tunix.rl.rollout import base_rollout

from dsd_jax import SpecConfig
from dsd_jax.integrations.tunix import SpecRollout
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
RANK, ALPHA = 16, 32.0


class Ids:  # a tokenizer Tunix's protocol accepts (nothing is generated here)
    def encode(self, text, **kw):
        return [3]

    def decode(self, ids, **kw):
        return ""

    def bos_id(self):
        return 1

    def eos_id(self):
        return 2

    def pad_id(self):
        return 0


cfg = llama3.ModelConfig(num_layers=8, vocab_size=32000, embed_dim=1024, hidden_dim=4096, num_heads=16,
                         head_dim=64, num_kv_heads=4, rope_theta=10000, norm_eps=1e-5)
base = llama3.Llama3(cfg, rngs=nnx.Rngs(0))
state = nnx.state(base, nnx.Param)
keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(state))))
nnx.update(base, jax.tree.map(lambda x: x + 0.02 * jax.random.normal(next(keys), x.shape), state))
tokens = jnp.ones((1, 4), jnp.int32)
policy = qwix.apply_lora_to_model(base, qwix.LoraProvider(module_path=".*_proj", rank=RANK, alpha=ALPHA),
                                  tokens, jnp.arange(4)[None], None, jnp.ones((1, 4, 4), bool), rngs=nnx.Rngs(1))
adapters = nnx.state(policy, nnx.LoRAParam)
keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(adapters))))
nnx.update(policy, jax.tree.map(lambda x: x + 0.01 * jax.random.normal(next(keys), x.shape), adapters))
adapters = nnx.state(policy, nnx.LoRAParam)
full_state = nnx.state(base, nnx.Param)

rollout_config = base_rollout.RolloutConfig(max_tokens_to_generate=8, max_prompt_length=8, kv_cache_size=32)
common = dict(tokenizer=Ids(), rollout_config=rollout_config, max_batch_size=1, prefill_chunk=16,
              spec=SpecConfig(method="ngram", num_speculative_tokens=2))
lora_rollout = SpecRollout(rollout_actor=policy, lora_alpha=ALPHA, **common)
full_rollout = SpecRollout(rollout_actor=base, **common)
kept = list(lora_rollout._lora.base.values())
copy = jax.jit(lambda leaves: [jnp.copy(x) for x in leaves])
pairs = [(a, b) for a, b in zip(*[[x for n, x in sorted(lora_rollout._lora.adapters.items()) if n.endswith(s)]
                                  for s in ("_lora_a", "_lora_b")])]
products = jax.jit(lambda pairs: [jnp.tensordot(a, b, 1, precision=jax.lax.Precision.HIGHEST) for a, b in pairs])

variants = {
    "lora": lambda: lora_rollout.update_params(adapters, (nnx.LoRAParam,)),
    "full": lambda: full_rollout.update_params(full_state, (nnx.Param,)),
    "copy": lambda: copy(kept),
    "products": lambda: products(pairs),
}
engines = {"lora": lora_rollout.engine, "full": full_rollout.engine}


def timed(name, calls=3):
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        result = variants[name]()
        jax.block_until_ready(engines[name]._target_params if name in engines else result)
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


for name in variants:  # compile and warm
    timed(name, 1)
times = {v: [] for v in variants}
order = list(variants)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        times[v].append(timed(v))

total = sum(x.nbytes for x in jax.tree.leaves(lora_rollout.engine._target_params))
adapted = sum(x.nbytes for x in kept)
elements = sum(x.size for x in kept)
print(f"{REPEATS} pairs; {total / 4 / 1e6:.0f}M float32 parameters ({total / 2**20:.0f} MiB), LoRA rank {RANK} on "
      f"{len(kept)} leaves holding {adapted / 2**20:.0f} MiB ({adapted / total:.0%}; kept base copies: that much "
      f"device memory again), a.b: {2 * RANK * elements / 1e9:.1f} GFLOP")
for v, moved in (("lora", 2 * adapted), ("full", 2 * total), ("copy", 2 * adapted), ("products", adapted)):
    t = np.median(times[v])
    print(f"{v}: {1e3 * t:.1f} ms a call, {moved / t / 1e9:.2f} GB/s of weight reads and writes, "
          f"{2 * RANK * elements / t / 1e9 if v in ('lora', 'products') else 0:.1f} GFLOP/s")
print(f"lora/full {format_ratio(paired_ratio(times['lora'], times['full']), digits=3)}")
print(f"lora/copy {format_ratio(paired_ratio(times['lora'], times['copy']), digits=3)} (the floor of its bytes)")
both = [c + p for c, p in zip(times["copy"], times["products"])]
print(f"lora/(copy + products) {format_ratio(paired_ratio(times['lora'], both), digits=3)}")
