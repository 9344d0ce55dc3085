"""What sharing a prompt preamble saves a batch, in one process, interleaved and paired.

A call: `generate` of 8 prompts, each a common preamble of P tokens followed by O tokens
of its own, greedy, max_tokens T, on the built-in pair (K = 2 static) in an engine of 8
slots. P = 0 is the control (nothing shared); P = 32 with O = 480 the least share the
engine takes, behind long prompts of their own. Variants: "whole" (`SpecEngine(share_prefixes=False)`: every prompt prefilled
whole) and "shared" (the default: the first prompt prefilled whole, its slot copied into
the other seven, which prefill their 24 tokens). The two engines' outputs are compared
token for token. Usage: python ab.py [repeats]"""
import random
import sys
import time

import numpy as np

import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
target, draft, tok = builtin()
engines = {name: dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=8,
                                max_seq_len=1024, share_prefixes=name == "shared")
           for name in ("whole", "shared")}
for eng in engines.values():
    eng.warmup()
rng = np.random.default_rng(0)
CASES = [(P, O, T) for P in (64, 512) for O in (24,) for T in (1, 32)] + [(32, 480, 1), (0, 512, 1)]
prompts = {(P, O): [pre + rng.integers(10, 4000, O).tolist() for _ in range(8)]
           for P, O in {(P, O) for P, O, _ in CASES} for pre in [rng.integers(10, 4000, P).tolist()]}


def timed(name, P, O, T):
    params = dsd.SamplingParams(temperature=0.0, max_tokens=T, ignore_eos=True)
    engines[name].reset_prefix_cache()  # cold: not the last call's finished requests (since 5ac6ad0)
    t0 = time.perf_counter()
    out = engines[name].generate(prompts[P, O], params)
    return time.perf_counter() - t0, [o.token_ids for o in out]


print(f"{REPEATS} pairs a case; 8 prompts = preamble P + O own tokens, greedy, max_tokens T, "
      "built-in pair, K = 2; ratio: dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
for P, O, T in CASES:
    same = timed("whole", P, O, T)[1] == timed("shared", P, O, T)[1]
    times = {v: [] for v in engines}
    order = list(engines)
    for r in range(REPEATS):
        random.Random(r).shuffle(order)
        for v in order:
            times[v].append(timed(v, P, O, T)[0])
    print(f"P={P:4d} O={O:3d} T={T:3d}: whole {1e3 * np.median(times['whole']):7.1f} ms, shared "
          f"{1e3 * np.median(times['shared']):7.1f} ms, shared/whole "
          f"{format_ratio(paired_ratio(times['shared'], times['whole']), digits=3)}; same tokens: {same}")
m = engines["shared"].metrics()
print(f"shared engine: prefill_tokens {m['prefill_tokens']}, shared_prefix_tokens {m['shared_prefix_tokens']}")
