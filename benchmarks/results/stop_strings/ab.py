"""What stop strings cost when they never match: the built-in pair, static K = 2 and plain
decoding, B = 1 and 16, 64 greedy tokens a request; generate() timed with and without two
stop strings that never occur, interleaved in random order, paired per repeat.

With a string the engine scans each dispatch's new tokens on the host (`stop_strings.Text`)
and runs 8 rounds a dispatch at most (a lone row with a settled K runs 32 without)."""
import random
import statistics
import sys
import time

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 12
target, draft, tok = models.builtin()
prompts = [tok.encode(p).ids[-48:] for p in models.heldout_prompts(16)]
engines = {k: SpecEngine(target, draft, SpecConfig(num_speculative_tokens=k) if k else SpecConfig(method="none"),
                         max_batch_size=16, max_seq_len=160, tokenizer=tok) for k in (0, 2)}
for e in engines.values():
    e.warmup()
plain = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
strings = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, stop=["never seen", "</answer>"])
rng = random.Random(0)
times = {}
for rep in range(REPEATS + 1):  # the first is untimed
    cells = [(k, b, name) for k in engines for b in (1, 16) for name in ("plain", "strings")]
    rng.shuffle(cells)
    for k, b, name in cells:
        sp = plain if name == "plain" else strings
        t0 = time.perf_counter()
        outs = engines[k].generate(prompts[:b], sp)
        dt = time.perf_counter() - t0
        assert all(len(o.token_ids) == 64 for o in outs)
        if rep:
            times.setdefault((k, b, name), []).append(dt)
boot = np.random.default_rng(0)
for k in engines:
    for b in (1, 16):
        a, s = np.array(times[(k, b, "plain")]), np.array(times[(k, b, "strings")])
        ratios = s / a
        means = [np.median(boot.choice(ratios, len(ratios))) for _ in range(2000)]
        lo, hi = np.percentile(means, [2.5, 97.5])
        print(f"K={k} B={b:2d}: plain {statistics.median(a) * 1e3:6.1f} ms, with stop strings "
              f"{statistics.median(s) * 1e3:6.1f} ms: ratio {np.median(ratios):.3f} [{lo:.3f}, {hi:.3f}] "
              f"({len(ratios)} pairs)")
