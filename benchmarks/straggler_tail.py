"""How much of a fixed group's decode time is its straggler tail, per configuration.

    python benchmarks/straggler_tail.py [--batch-size 16] [--configs vanilla,static-3]
        [--profile benchmarks/results/bench_full_s5.profile.json] [--repeats 2] [--max-tokens 64]

The bench's sweep runs groups of B prompts with equal max_tokens. With K > 0 rows
advance at different rates, so the group lasts as long as its slowest row, while the
goodput model AL(K) / ITL(B, K) assumes the batch stays full. Configurations are the
bench's names and run on the bench's engines and controllers (`dsd_jax.bench.runner`:
``dynamic`` is the default makespan objective, ``dynamic-throughput`` the batch-mean
goodput; each dynamic configuration keeps one controller across its runs), interleaved
as the bench interleaves them. Each run prints the decode time, the steps per live batch
size, and the decode time over a full-batch ideal: tokens / (B * AL) steps at the full
batch's median step time. The last lines give each configuration's median decode time
over the first configuration's.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from dsd_jax import SamplingParams, models
from dsd_jax.bench.runner import Runner, run_interleaved
from dsd_jax.bench.settings import has_dynamic, parse_config
from dsd_jax.bench.workloads import Point
from dsd_jax.profile import Profile


def describe(config: str, steps: list[dict], batch_size: int) -> tuple[float, str]:
    """(decode ms, a line on where the steps went) for one run's trace after its first step."""
    wall = sum(s["wall_ms"] for s in steps)
    tokens = sum(s["emitted"] for s in steps)
    full = [s for s in steps if s["batch_size"] == batch_size]
    al = sum(s["emitted"] for s in full) / sum(s["batch_size"] for s in full)
    ideal = tokens / (batch_size * al) * float(np.median([s["wall_ms"] for s in full]))
    hist = dict(sorted(collections.Counter(s["batch_size"] for s in steps).items()))
    ks = dict(sorted(collections.Counter(s["k"] for s in steps).items()))
    return wall, (f"{config}: decode {wall:.0f} ms for {tokens} tokens in {len(steps)} steps, AL {al:.2f}; "
                  f"full-batch ideal {ideal:.0f} ms -> {wall / ideal:.2f}x; steps per live batch {hist}; "
                  f"steps per K {ks}")


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
    for c in configs:
        parse_config(c)
    profile = Profile.load(args.profile) if args.profile else None
    if profile is None and has_dynamic(configs):
        raise SystemExit("dynamic configurations need --profile")
    target, draft, tokenizer = models.builtin()
    runner = Runner(target, draft, tokenizer, configs=configs, max_batch_size=64, max_seq_len=448,
                    max_k=profile.max_k if profile else 1, batch_buckets=None, prefill_chunk=256,
                    compilation_cache_dir=args.compilation_cache_dir, log=print)
    runner.warmup()
    runner.profiles["draft_model"], runner.profile_paths["draft_model"] = profile, args.profile
    point = Point("straggler", args.batch_size, [models.heldout_prompts(args.batch_size, seed=args.seed)],
                  configs, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    decode_ms = collections.defaultdict(list)

    def run(config, p, u):
        result = runner.run(config, p.units[u], p.sampling)
        engine = runner.vanilla if config == "vanilla" else runner.spec
        decode = [t for t in engine.stats.trace if not t["after_prefill"]]  # the rest include the prefill
        ms, line = describe(config, decode, args.batch_size)
        decode_ms[config].append(ms)
        print(line, flush=True)
        return result

    run_interleaved([point], run, args.repeats)
    base = float(np.median(decode_ms[configs[0]]))
    for config in configs:
        print(f"{config:>18}: median decode {np.median(decode_ms[config]):.0f} ms = "
              f"{np.median(decode_ms[config]) / base:.2f}x {configs[0]}'s")


if __name__ == "__main__":
    main()
