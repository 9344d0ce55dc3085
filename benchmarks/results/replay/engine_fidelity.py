"""Does the replay make today's engine's decisions? Runs the sweep's prompts through the
engine in `sequence.py`'s groups and order, one controller throughout, and compares every
unit's steps (K, live rows, mean accepted) with the replay's of the same unit, the
replay's controller built the same way and fed the replay's steps.

    PYTHONPATH=. python engine_fidelity.py sweep.json ../bench_full_s28.profile.json --batch-sizes 1,2,4
    PYTHONPATH=. python engine_fidelity.py sweep.json ../bench_full_s28.profile.json --learn

Without `--learn` both controllers price steps at the profile's ITL as it is
(`latency_forgetting=0`), so what differs is the replay's model of the engine: its
acceptance (`agreement.py`'s m), dispatches and catch-up. With `--learn` the engine's
controller learns from its measured step times (the default), the replay's from the
profile's: how far the engine's own timing moves its choices. (`fidelity.py` checks a
trace of the bench of 2026-11-25, recorded with that day's controller.)
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import sequence
from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.bench.commands import _builtin_prompts
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.loading import encode_prompts
from dsd_jax.models import builtin
from dsd_jax.profile import Profile


def controller(profile_path, buckets, learn: bool) -> Controller:
    """dynamic as the bench runs it (makespan, K up to 6), with or without latency learning."""
    dynamic = DynamicConfig(objective="makespan") if learn else DynamicConfig(objective="makespan",
                                                                               latency_forgetting=0.0)
    spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=dynamic)
    return Controller(spec, Profile.load(profile_path), buckets[-1], batch_buckets=buckets)


def sweep_prompts(sweep, tok, vocab_size):
    """The token ids `agreement.py` measured m on: the first held-out prompts, cut as it cut them."""
    n, cut = len(sweep["agreement"]), max(sweep["prompt_lens"])
    ids = [p[:cut] for p in encode_prompts(_builtin_prompts(n), tok, vocab_size)]
    assert [p[:8] for p in ids] == sweep["prompts"] and [len(p) for p in ids] == sweep["prompt_lens"], \
        "these are not the prompts sweep.json was measured on"
    return ids


def engine_units(engine, ctl, ids, order, b, max_tokens):
    """[(K, live rows, mean accepted) a round] for each group of `b` prompts in `order`."""
    engine.controller = ctl
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    units = []
    for start in range(0, len(order) - b + 1, b):
        engine.stats.reset()
        engine.generate([ids[j] for j in order[start:start + b]], sampling)
        units.append([(t["k"], t["batch_size"], t["mean_accepted"]) for t in engine.stats.trace])
    return units


def compare(real, replayed) -> str:
    """How many units' step sequences agree, where the others first part, and the K mix of each."""
    lines, same = [], 0
    for u, (r, s) in enumerate(zip(real, replayed)):
        a = [(k, n, round(m, 2)) for k, n, m in r]
        b = [(k, n, round(m, 2)) for k, n, m in s]
        same += a == b
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            lines.append(f"  unit {u}: {len(a)} rounds in the engine, {len(b)} replayed; first difference at round "
                         f"{first}: engine {a[first:first + 3]}, replay {b[first:first + 3]}")

    def mix(units):
        ks = np.array([k for steps in units for k, *_ in steps])
        return " ".join(f"K{k}:{100 * np.mean(ks == k):.0f}%" for k in np.unique(ks)) + f" ({len(ks)} rounds)"

    lines.append(f"  identical: {same} of {len(real)} units; K mix: engine {mix(real)}, replay {mix(replayed)}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("profile")
    ap.add_argument("--batch-sizes", default="1,2,4")
    ap.add_argument("--order", type=int, default=0, help="sequence.py's random order (seed 100 + ORDER)")
    ap.add_argument("--units", type=int, default=None, help="only the first UNITS groups at each B")
    ap.add_argument("--learn", action="store_true", help="the engine's controller learns from its step times")
    args = ap.parse_args()
    sweep = json.load(open(args.sweep))
    profile = Profile.load(args.profile)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    buckets = [b for b in (1, 2, 4, 8, 16) if b <= max(batch_sizes)]
    target, draft, tok = builtin()
    ids = sweep_prompts(sweep, tok, target.config.vocab_size)
    max_tokens = sweep["max_tokens"]
    engine = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=6,
                                                  dynamic=DynamicConfig(objective="makespan")),
                        max_batch_size=buckets[-1], max_seq_len=profile.max_seq_len,
                        batch_buckets=buckets, profile=profile, share_prefixes=False)
    engine.warmup()
    order = np.random.default_rng(100 + args.order).permutation(len(ids))
    for b in batch_sizes:
        n = len(order) // b if args.units is None else min(args.units, len(order) // b)
        ctl = controller(args.profile, buckets, args.learn)
        real = engine_units(engine, ctl, ids, order[:n * b], b, max_tokens)
        replayed = []
        sequence.total_ms(controller(args.profile, buckets, False), sweep, order[:n * b], b, profile, trace=replayed)
        print(f"B={b}, order {args.order}, {'latency learning in the engine' if args.learn else 'no latency learning'}:")
        print(compare(real, [steps for _, _, steps in replayed]))
        if args.learn:  # what the engine's step times taught its controller about the profile
            factors = ctl._latency.correction.factors(b)
            print(f"  learnt step time / profiled ITL at bucket {b}, K = 0..6: "
                  + " ".join(f"{x:.3f}" for x in factors))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
