"""How much of a fixed group's decode time is its straggler tail, per configuration.

    python benchmarks/straggler_tail.py [--batch-size 16] [--configs vanilla,static-3]
        [--profile benchmarks/results/bench_full.profile.json] [--repeats 2] [--max-tokens 64]

The bench's sweep runs groups of B prompts with equal max_tokens. With K > 0 rows
advance at different rates, so the group lasts as long as its slowest row, while the
goodput model AL(K) / ITL(B, K) assumes the batch stays full. Configurations are the
bench's names (``dynamic``: the default makespan objective; ``dynamic-throughput``: the
batch-mean goodput); each dynamic configuration keeps one controller across its runs,
as the bench does. Runs are interleaved; each prints the decode time, the steps
per live batch size, and the decode time over a full-batch ideal: tokens / (B * AL)
steps at the full batch's median step time. The last lines give each configuration's
median decode time over vanilla's.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models
from dsd_jax.bench import DYNAMIC_OBJECTIVES, parse_config
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.profile import Profile


def make_controller(config: str, max_k: int, profile: Profile | None, engine: SpecEngine) -> Controller:
    """The bench's controllers (method none for vanilla)."""
    kind, k = parse_config(config)
    if kind == "vanilla":
        return Controller(SpecConfig(method="none"), None, engine.max_batch_size)
    if kind == "static":
        return Controller(SpecConfig(num_speculative_tokens=k), None, engine.max_batch_size)
    if profile is None:
        raise SystemExit("dynamic configurations need --profile")
    spec = SpecConfig(num_speculative_tokens=max_k, dynamic=DynamicConfig(objective=DYNAMIC_OBJECTIVES[config]))
    return Controller(spec, profile, engine.max_batch_size, batch_buckets=engine.batch_buckets)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--configs", default="vanilla,static-3")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="which held-out prompts")
    ap.add_argument("--compilation-cache-dir", default=None)
    args = ap.parse_args()
    configs = args.configs.split(",")
    profile = Profile.load(args.profile) if args.profile else None
    max_k = profile.max_k if profile else 1
    max_k = max([max_k] + [k for kind, k in map(parse_config, configs) if kind == "static"])
    target, draft, tokenizer = models.builtin()
    engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=max_k), max_batch_size=64,
                        max_seq_len=448, tokenizer=tokenizer, compilation_cache_dir=args.compilation_cache_dir)
    engine.warmup()
    controllers = {c: make_controller(c, max_k, profile, engine) for c in configs}
    prompts = models.heldout_prompts(args.batch_size, seed=args.seed)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    walls = collections.defaultdict(list)
    for _ in range(args.repeats):
        for config in configs:
            engine.controller = controllers[config]
            engine.stats.reset()
            engine.generate(prompts, sampling)
            steps = engine.stats.trace[1:]  # the first result includes the prefill
            wall = sum(s["wall_ms"] for s in steps)
            walls[config].append(wall)
            tokens = sum(s["emitted"] for s in steps)
            full = [s for s in steps if s["batch_size"] == args.batch_size]
            al = sum(s["emitted"] for s in full) / sum(s["batch_size"] for s in full)
            ideal = tokens / (args.batch_size * al) * float(np.median([s["wall_ms"] for s in full]))
            hist = dict(sorted(collections.Counter(s["batch_size"] for s in steps).items()))
            ks = dict(sorted(collections.Counter(s["k"] for s in steps).items()))
            print(f"{config}: decode {wall:.0f} ms for {tokens} tokens in {len(steps)} steps, AL {al:.2f}; "
                  f"full-batch ideal {ideal:.0f} ms -> {wall / ideal:.2f}x; steps per live batch {hist}; "
                  f"steps per K {ks}", flush=True)
    base = float(np.median(walls[configs[0]]))
    for config in configs:
        print(f"{config:>18}: median decode {np.median(walls[config]):.0f} ms = "
              f"{np.median(walls[config]) / base:.2f}x {configs[0]}'s")


if __name__ == "__main__":
    main()
