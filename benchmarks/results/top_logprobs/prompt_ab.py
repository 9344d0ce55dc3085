"""What prompt logprobs cost an admission, in one process, interleaved and paired.

A call: `generate` of 4 prompts of 128 tokens, max_tokens 1 (so the prefill is most of it),
greedy, on the built-in pair (vocabulary 4096) with max_logprobs=5. Variants: "plain" (no
prompt logprobs: the plain prefill programs), "own" (prompt_logprobs=0: the scored prefill,
each token's own logprob) and "top5" (prompt_logprobs=5).
Usage: python prompt_ab.py [repeats]"""
import random
import sys
import time

import numpy as np

import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
target, draft, tok = builtin()
eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=4,
                     max_seq_len=256, tokenizer=tok, max_logprobs=5)
rng = np.random.default_rng(0)
prompts = [rng.integers(10, 4000, 128).tolist() for _ in range(4)]
variants = {"plain": None, "own": 0, "top5": 5}


def timed(v):
    sp = dsd.SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=variants[v])
    t0 = time.perf_counter()
    eng.generate(prompts, sp)
    return time.perf_counter() - t0


eng.warmup()
for v in variants:
    timed(v)
times = {v: [] for v in variants}
order = list(variants)
for _ in range(REPEATS):
    random.Random(_).shuffle(order)
    for v in order:
        times[v].append(timed(v))
def ratio(a, b):
    return format_ratio(paired_ratio(times[a], times[b]), digits=3)


print(f"{REPEATS} pairs; 4 prompts x 128 tokens, max_tokens 1; ratios: dsd_jax.stats.paired_ratio "
      "(geometric mean, 95% interval)")
print(f"plain {1e3 * np.median(times['plain']):.1f} ms | own/plain {ratio('own', 'plain')} | "
      f"top5/plain {ratio('top5', 'plain')}")
