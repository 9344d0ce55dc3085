"""Where stop strings' cost at static K = 2 comes from: the 8-round cap on dispatches, or
the host's scans. Three configurations interleaved, paired per repeat: no strings; two
strings that never occur (the shipped rule: 8 rounds a dispatch at most, no lone-row
run-on); the same strings with the rounds rule told there are none (the scans alone)."""
import random
import statistics
import sys
import time

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models
from dsd_jax import dispatch

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 24
target, draft, tok = models.builtin()
prompts = [tok.encode(p).ids[-48:] for p in models.heldout_prompts(16)]
engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=2), max_batch_size=16, max_seq_len=160,
                    tokenizer=tok)
engine.warmup()
plain = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
strings = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, stop=["never seen", "</answer>"])
shipped_rounds = dispatch.DispatchPolicy.rounds


def uncapped_rounds(self, live, *args):
    import dataclasses
    bare = [dataclasses.replace(r, params=plain) for r in live]
    return shipped_rounds(self, bare, *args)


count = [0]
process = engine._process


def counted(d):  # one call a dispatch
    count[0] += 1
    return process(d)


engine._process = counted
rng = random.Random(0)
times, dispatches = {}, {}
configs = ("plain", "strings", "strings-uncapped")
for rep in range(REPEATS + 1):
    cells = [(b, c) for b in (1, 16) for c in configs]
    rng.shuffle(cells)
    for b, c in cells:
        dispatch.DispatchPolicy.rounds = uncapped_rounds if c == "strings-uncapped" else shipped_rounds
        count[0] = 0
        t0 = time.perf_counter()
        outs = engine.generate(prompts[:b], plain if c == "plain" else strings)
        dt = time.perf_counter() - t0
        assert all(len(o.token_ids) == 64 for o in outs)
        if rep:
            times.setdefault((b, c), []).append(dt)
            dispatches.setdefault((b, c), []).append(count[0])
dispatch.DispatchPolicy.rounds = shipped_rounds
boot = np.random.default_rng(0)
for b in (1, 16):
    base = np.array(times[(b, "plain")])
    line = f"B={b:2d}: plain {statistics.median(base) * 1e3:6.1f} ms"
    for c in configs[1:]:
        ratios = np.array(times[(b, c)]) / base
        meds = [np.median(boot.choice(ratios, len(ratios))) for _ in range(2000)]
        lo, hi = np.percentile(meds, [2.5, 97.5])
        line += f"; {c} {np.median(ratios):.3f} [{lo:.3f}, {hi:.3f}]"
    print(line + f" ({len(base)} pairs); dispatches a call: " +
          ", ".join(f"{c} {statistics.median(dispatches[(b, c)])}" for c in configs))
