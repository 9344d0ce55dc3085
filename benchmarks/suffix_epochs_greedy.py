"""Epoch 2 of a greedy rollout drafts from epoch 1's completions (method "suffix" with a
RolloutMemory) vs prompt lookup over the slot's own tokens ("ngram"): the mechanism of
SPEC-RL/DAS in its clearest case (a deterministic policy repeats itself exactly).

    python benchmarks/suffix_epochs_greedy.py
"""
import time
from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.rollout_memory import RolloutMemory
t, d, tok = builtin()
prompts = heldout_prompts(4, num_lines=6, seed=3)
sp = SamplingParams(temperature=0.0, max_tokens=64, stop_token_ids=(0,))
for method in ("ngram", "suffix"):
    e = SpecEngine(t, None, SpecConfig(method=method, num_speculative_tokens=4, prompt_lookup_max=4),
                   max_batch_size=4, max_seq_len=320, tokenizer=tok, prefill_chunk=128, batch_buckets=(4,))
    mem = RolloutMemory()
    for epoch in (1, 2):
        e.stats.reset(); t0 = time.perf_counter()
        outs = e.generate(prompts, sp, memory=mem if method == "suffix" else None)
        m = e.metrics()
        print(method, "epoch", epoch, "AL %.2f" % m["mean_accepted_len"], "a_i", [round(x, 2) for x in m["acceptance_per_position"]], "%.1f s" % (time.perf_counter() - t0), flush=True)
