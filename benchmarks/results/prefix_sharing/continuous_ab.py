"""Sharing a preamble under continuous batching: later admissions take it from running requests.

A call: `generate` of 24 prompts, each a common 512-token preamble followed by 24 tokens of
its own, greedy, max_tokens cycling 8, 16, ..., 40 (so requests finish at different times
and are admitted a few at a time as slots free), on the built-in pair at K = 2 in an engine
of 8 slots. Variants: "whole" (`share_prefixes=False`) and "shared" (the default: the first
admission prefills one prompt whole and copies it into seven; each later admission copies
the preamble from a running request's slot). Outputs compared token for token.
Usage: python continuous_ab.py [repeats]"""
import random
import sys
import time

import numpy as np

import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
target, draft, tok = builtin()
engines = {name: dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=8,
                                max_seq_len=1024, share_prefixes=name == "shared")
           for name in ("whole", "shared")}
for eng in engines.values():
    eng.warmup()
rng = np.random.default_rng(0)
preamble = rng.integers(10, 4000, 512).tolist()
prompts = [preamble + rng.integers(10, 4000, 24).tolist() for _ in range(24)]
params = [dsd.SamplingParams(temperature=0.0, max_tokens=8 * (1 + i % 5), ignore_eos=True) for i in range(24)]


def timed(name):
    engines[name].reset_metrics()
    engines[name].reset_prefix_cache()  # cold: not the last call's finished requests (since 5ac6ad0)
    t0 = time.perf_counter()
    out = engines[name].generate(prompts, params)
    return time.perf_counter() - t0, [o.token_ids for o in out]


same = timed("whole")[1] == timed("shared")[1]
shared_tokens = engines["shared"].metrics()["shared_prefix_tokens"]
times = {v: [] for v in engines}
order = list(engines)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        times[v].append(timed(v)[0])
print(f"{REPEATS} pairs; 24 prompts = 512-token preamble + 24 own, max_tokens 8..40, 8 slots, greedy, "
      "built-in pair, K = 2; ratio: dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
print(f"same tokens: {same}; shared_prefix_tokens a call: {shared_tokens} (23 x 512 = {23 * 512})")
print(f"whole {1e3 * np.median(times['whole']):.1f} ms, shared {1e3 * np.median(times['shared']):.1f} ms, "
      f"shared/whole {format_ratio(paired_ratio(times['shared'], times['whole']), digits=3)}")
