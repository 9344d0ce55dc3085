"""A stale draft as the policy moves: dynamic K against K=0, and distillation's recovery.

RL moves the target every step while the draft stays as it was. This simulates that with
the built-in pair: the target's matrices drift along one fixed random direction,
`W_s = W_0 + s * drift * std(W_0) * eps`, s = 0..levels-1. At each level:

- acceptance: mean committed tokens per step at a static K (1.0 = every draft rejected);
- speed: the same engine under the goodput controller (profiled on the fresh pair, then
  learning acceptance live) against K=0 (plain decoding: the draft is not run), paired and
  interleaved (each repeat runs both, the order alternating), drafter-invariant sampling at
  temperature 1 so both produce the same tokens (checked) and the ratio compares the same
  work.

Then, at the most stale level, `dsd_jax.distill.DraftDistiller` trains the draft on that
level's rollouts against the moved target, and acceptance is measured again.

    python benchmarks/draft_staleness.py --out benchmarks/results/draft_staleness/draft_staleness.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.distill import DraftDistiller
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profiler import profile_engine
from suffix_rollout import Static  # noqa: E402  (a fixed-K controller; same folder)

EOS = 0


def drifted(params, level: float, seed: int = 0):
    leaves = jax.tree.leaves(params)
    keys = iter(jax.random.split(jax.random.key(seed), len(leaves)))
    return jax.tree.map(lambda x: x + level * jnp.std(x) * jax.random.normal(next(keys), x.shape,
                                                                               x.dtype)
                        if x.ndim == 2 else x, params)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--levels", default="0,0.15,0.3,0.6", help="drift per level (x std)")
    ap.add_argument("--k", type=int, default=3, help="max K (and the static K of the acceptance run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--distill-steps", type=int, default=24)
    ap.add_argument("--distill-rounds", type=int, default=2,
                    help="rollout + distill rounds at the last level")
    ap.add_argument("--out", default="draft_staleness.json")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    target, draft, tok = builtin()
    prompts = heldout_prompts(args.prompts, num_lines=4, seed=5)
    spec = SpecConfig(method="draft_model", num_speculative_tokens=args.k,
                      acceptance="drafter_invariant")
    engine = SpecEngine(target, draft, spec, max_batch_size=args.prompts, max_seq_len=256,
                        tokenizer=tok, prefill_chunk=128, batch_buckets=(2, args.prompts))
    engine.warmup()
    prof = profile_engine(engine, context_lengths=(96,), repeats=3, warmup_reps=1,
                          acceptance_max_tokens=24, temperatures=(1.0,))
    dyn_spec = SpecConfig(method="draft_model", num_speculative_tokens=args.k,
                          acceptance="drafter_invariant", dynamic=DynamicConfig())
    dynamic = lambda: Controller(dyn_spec, prof, max_batch_size=args.prompts,  # noqa: E731
                                 batch_buckets=engine.batch_buckets)
    base = nnx.state(target)
    sampling = lambda seed: SamplingParams(temperature=1.0, max_tokens=args.max_tokens,  # noqa: E731
                                           stop_token_ids=(EOS,), seed=seed)

    def run(controller, seed):
        engine.controller = controller
        engine.stats.reset()
        t = time.perf_counter()
        outs = engine.generate(prompts, sampling(seed))
        wall = time.perf_counter() - t
        n = sum(len(o.token_ids) for o in outs)
        m = engine.metrics()
        return outs, {"seconds": wall, "tokens": n, "tokens_per_s": n / wall,
                      "mean_accepted_len": m["mean_accepted_len"], "k_hist": m["k_hist"]}

    levels = [float(x) for x in args.levels.split(",")]
    results, mismatches = [], 0
    for level in levels:
        engine.set_params(target=drifted(base, level))
        _, acc = run(Static(args.k), seed=1)
        pairs = []
        for rep in range(args.repeats):
            order = ("dynamic", "k0") if rep % 2 == 0 else ("k0", "dynamic")
            got = {}
            for name in order:
                outs, m = run(dynamic() if name == "dynamic" else Static(0), seed=100 + rep)
                got[name] = (outs, m)
            mismatches += sum(a.token_ids != b.token_ids
                              for a, b in zip(got["dynamic"][0], got["k0"][0]))
            pairs.append({"dynamic": got["dynamic"][1], "k0": got["k0"][1],
                          "ratio": got["dynamic"][1]["tokens_per_s"] / got["k0"][1]["tokens_per_s"]})
        ratios = [p["ratio"] for p in pairs]
        row = {"drift": level, "accepted_len_static_k": acc["mean_accepted_len"],
               "dynamic_over_k0_tokens_per_s": {"median": statistics.median(ratios),
                                                "min": min(ratios), "max": max(ratios)},
               "dynamic_k_hist": pairs[-1]["dynamic"]["k_hist"], "pairs": pairs}
        results.append(row)
        print(f"drift {level:5.2f}  AL(K={args.k}) {acc['mean_accepted_len']:.2f}  dynamic/K0 "
              f"tok/s median {row['dynamic_over_k0_tokens_per_s']['median']:.3f} "
              f"[{min(ratios):.3f}, {max(ratios):.3f}]  dynamic K hist {row['dynamic_k_hist']}",
              flush=True)

    # distillation at the most stale level, on that level's own rollouts
    distiller = DraftDistiller(target, draft, learning_rate=1e-3, rows=8, temperature=1.0)
    log = []
    for r in range(args.distill_rounds):
        engine.controller = Static(args.k)
        outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=args.max_tokens,
                                                       stop_token_ids=(EOS,), seed=500 + r, n=2))
        t = time.perf_counter()
        m = distiller.refresh(engine, outs, steps=args.distill_steps)
        m["seconds"] = time.perf_counter() - t
        log.append(m)
        print(f"distill round {r}: KL {m['loss_before']:.3f} -> {m['loss_after']:.3f} "
              f"({m['seconds']:.1f}s)", flush=True)
    _, after = run(Static(args.k), seed=1)
    summary = {
        "accepted_len_fresh": results[0]["accepted_len_static_k"],
        "accepted_len_stale": results[-1]["accepted_len_static_k"],
        "accepted_len_after_distill": after["mean_accepted_len"],
        "min_dynamic_over_k0_median": min(r["dynamic_over_k0_tokens_per_s"]["median"] for r in results),
    }
    print(json.dumps(summary, indent=1))
    print(f"completions differing between dynamic and K=0: {mismatches}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "summary": summary, "levels": results, "distill": log,
                   "mismatches_dynamic_vs_k0": mismatches,
                   "seconds_total": time.perf_counter() - t_start}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
