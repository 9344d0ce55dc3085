"""Prompt 372 (B=32 group 11, row 20) has a 1-ulp top-2 gap at completion token 33 (near_ties_b32.log).
Run group 11 in shuffled row orders through vanilla and static K=1/K=4 (the bench's engines): does
that token flip with the row's place in the batch, and does anything else?"""
import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np
import dsd_jax as dsd
from dsd_jax import models
from dsd_jax.controller import Controller
from dsd_jax.bench.commands import _prompts_needed
from dsd_jax.loading import encode_prompts

target, draft, tok = models.builtin()
n = _prompts_needed(False, [1, 2, 4, 8, 16, 32, 64])
ids = [p[:128] for p in encode_prompts(models.heldout_prompts(n), tok, target.config.vocab_size)]
common = dict(max_batch_size=64, max_seq_len=448, tokenizer=tok, prefill_chunk=128)
van = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), **common)
eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(method="draft_model", num_speculative_tokens=6), **common)
sp = dsd.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
group = list(range(11 * 32, 12 * 32))
ref = {p: o.token_ids for p, o in zip(group, van.generate([ids[p] for p in group], sp))}
rng = np.random.default_rng(0)
for trial in range(6):
    order = list(rng.permutation(group))
    row = order.index(372)
    for name, k in (("vanilla", 0), ("static-1", 1), ("static-4", 4)):
        e = van if k == 0 else eng
        if k:
            e.controller = Controller(dsd.SpecConfig(method="draft_model", num_speculative_tokens=k), None, 64,
                                      batch_buckets=e.batch_buckets)
        outs = {p: o.token_ids for p, o in zip(order, e.generate([ids[p] for p in order], sp))}
        diff = [p for p in group if outs[p] != ref[p]]
        where = {p: next(t for t in range(64) if outs[p][t] != ref[p][t]) for p in diff}
        print(f"trial {trial} (372 at row {row}) {name}: differing prompts {where}", flush=True)
