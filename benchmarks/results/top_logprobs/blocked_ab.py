"""What scoring a prompt in logits blocks costs and saves, in one process, interleaved, paired.

A call: `generate` of 4 prompts of 500 tokens, max_tokens 1, greedy, prompt_logprobs=5, on
a one-layer model at Llama-3's vocabulary (`models.synthetic("llama-3.2-1b")` narrowed to
width 256: 128256 ids) with a 512-token prefill chunk. Variants: "whole" (the chunk's
[4, 512, 128256] float32 logits at once, 1 GiB: the budget raised past it) and "blocked"
(`step.PROMPT_LOGITS_BYTES`, 256 MiB: 128 positions at a time). Each variant is its own
engine; the budget is read when its scored prefill compiles, which `warmup` does.
Usage: python blocked_ab.py [repeats]"""
import random
import sys
import time

import numpy as np

import dsd_jax as dsd
from dsd_jax import step
from dsd_jax.models import synthetic
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
ROWS, CHUNK = 4, 512
narrow = dict(dtype="float32", num_layers=1, hidden_size=256, intermediate_size=512, num_heads=4,
              num_kv_heads=2, head_dim=64)
target, draft = (synthetic("llama-3.2-1b", seed=s, **narrow) for s in (0, 1))
budgets = {"whole": 1 << 40, "blocked": step.PROMPT_LOGITS_BYTES}
engines, scratch = {}, {}
for name, budget in budgets.items():
    step.PROMPT_LOGITS_BYTES = budget
    eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=ROWS,
                         max_seq_len=1024, prefill_chunk=CHUNK, max_logprobs=5)
    eng.warmup()
    engines[name] = eng
    scratch[name] = eng.programs.prefill_scored(ROWS, CHUNK).memory_analysis().temp_size_in_bytes
step.PROMPT_LOGITS_BYTES = budgets["blocked"]
rng = np.random.default_rng(0)
prompts = [rng.integers(10, 128000, 500).tolist() for _ in range(ROWS)]
params = dsd.SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=5)


def timed(name):
    t0 = time.perf_counter()
    out = engines[name].generate(prompts, params)
    return time.perf_counter() - t0, out


same = [o.prompt_logprobs for o in timed("whole")[1]] == [o.prompt_logprobs for o in timed("blocked")[1]]
times = {v: [] for v in budgets}
order = list(budgets)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        times[v].append(timed(v)[0])
print(f"{REPEATS} pairs; {ROWS} prompts x 500 tokens, chunk {CHUNK}, vocabulary 128256, max_tokens 1, "
      "prompt_logprobs=5; ratio: dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
print(f"prompt logprobs identical: {same}")
for v in budgets:
    print(f"{v}: median {1e3 * np.median(times[v]):.1f} ms, scored prefill ({ROWS}, {CHUNK}) scratch "
          f"{scratch[v] / 2**20:.0f} MiB")
print(f"blocked/whole {format_ratio(paired_ratio(times['blocked'], times['whole']), digits=3)}")
