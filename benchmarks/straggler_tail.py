"""How much of a fixed group's decode time is its straggler tail, per fixed K.

    python benchmarks/straggler_tail.py [--batch-size 16] [--ks 0,3] [--max-tokens 64]

The bench's sweep runs groups of B prompts with equal max_tokens. With K > 0 rows
advance at different rates, so the group lasts as long as its slowest row, while the
goodput model AL(K) / ITL(B, K) assumes the batch stays full. Each K runs twice,
interleaved with the others; each run prints the decode time, the steps per live batch
size, and the decode time over a full-batch ideal: tokens / (B * AL) steps at the full
batch's median step time.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models
from dsd_jax.controller import Controller


def fixed_k(k: int, max_batch_size: int) -> Controller:
    """The bench's static-K controller (method none for K = 0)."""
    spec = SpecConfig(num_speculative_tokens=k) if k else SpecConfig(method="none")
    return Controller(spec, None, max_batch_size)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--ks", default="0,3")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    target, draft, tokenizer = models.builtin()
    engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=max(max(ks), 1)), max_batch_size=64,
                        max_seq_len=448, tokenizer=tokenizer)
    engine.warmup()
    prompts = models.heldout_prompts(args.batch_size, seed=0)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for k in ks * 2:
        engine.controller = fixed_k(k, engine.max_batch_size)
        engine.stats.reset()
        engine.generate(prompts, sampling)
        steps = engine.stats.trace[1:]  # the first result includes the prefill
        wall = sum(s["wall_ms"] for s in steps)
        tokens = sum(s["emitted"] for s in steps)
        full = [s for s in steps if s["batch_size"] == args.batch_size]
        al = sum(s["emitted"] for s in full) / sum(s["batch_size"] for s in full)
        ideal = tokens / (args.batch_size * al) * float(np.median([s["wall_ms"] for s in full]))
        hist = dict(sorted(collections.Counter(s["batch_size"] for s in steps).items()))
        print(f"K{k}: decode {wall:.0f} ms for {tokens} tokens in {len(steps)} steps, AL {al:.2f}; "
              f"full-batch ideal {ideal:.0f} ms -> {wall / ideal:.2f}x; steps per live batch {hist}")


if __name__ == "__main__":
    main()
