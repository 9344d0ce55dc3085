"""Reproduce bench_full_s27's B=32 greedy mismatch: the bench's engines (vanilla: method none;
draft_model K<=6, 64 slots, buckets 1..64, max_seq_len 448, prefill chunk 128), static K=1
against vanilla on the 18 groups of 32 the sweep ran; at each mismatch, the target's top-2
logit gap at the first differing position."""
import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np
import jax, jax.numpy as jnp
import dsd_jax as dsd
from dsd_jax import models
from dsd_jax.controller import Controller
from dsd_jax.bench.commands import _prompts_needed
from dsd_jax.loading import encode_prompts
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'tests'))
from conftest import oracle_logits

k = int(sys.argv[1]) if len(sys.argv) > 1 else 1
groups = [int(g) for g in sys.argv[2].split(",")] if len(sys.argv) > 2 else range(18)
target, draft, tok = models.builtin()
n = _prompts_needed(False, [1, 2, 4, 8, 16, 32, 64])
ids = [p[:128] for p in encode_prompts(models.heldout_prompts(n), tok, target.config.vocab_size)]
common = dict(max_batch_size=64, max_seq_len=448, tokenizer=tok, prefill_chunk=128)
van = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), **common)
spec = dsd.SpecConfig(method="draft_model", num_speculative_tokens=6)
eng = dsd.SpecEngine(target, draft, spec, **common)
eng.controller = Controller(dsd.SpecConfig(method="draft_model", num_speculative_tokens=k), None, 64,
                            batch_buckets=eng.batch_buckets)
sp = dsd.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
bad = []
van_out = {}
for g in groups:
    group = ids[g * 32:(g + 1) * 32]
    a = [o.token_ids for o in van.generate(group, sp)]
    b = [o.token_ids for o in eng.generate(group, sp)]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            j = next(t for t in range(len(x)) if x[t] != y[t])
            bad.append((g, i, j))
            van_out[(g, i)] = (x, y)
            print(f"group {g} row {i} (prompt {g * 32 + i}): first difference at token {j}: vanilla {x[j]} spec {y[j]}", flush=True)
    print(f"group {g}: {sum(1 for b_ in bad if b_[0] == g)} mismatches", flush=True)
# top-2 gap of the target's logits at each divergence, by a plain forward of prompt + common prefix
for g, i, j in bad:
    p = ids[g * 32 + i]
    x, y = van_out[(g, i)]
    ref = np.asarray(oracle_logits(target, p + x[:j], 256), np.float64)
    logits = ref
    top = np.sort(logits)[-2:]
    print(f"prompt {g * 32 + i} token {j}: top-2 logits {top[1]:.6f} {top[0]:.6f} gap {top[1] - top[0]:.3g}; "
          f"full-forward argmax {int(np.argmax(logits))}, vanilla took {x[j]}, spec took {y[j]}; "
          f"logit of vanilla's {logits[x[j]]:.6f}, of spec's {logits[y[j]]:.6f}", flush=True)
