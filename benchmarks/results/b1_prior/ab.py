"""Does the bench's 16-prompt acceptance prior decide dynamic at B=1?

bench_full_s20 had dynamic at 0.95x [0.90, 0.99] of static-4 at B=1, holding K=0 in 32% of
steps. Its profile measured acceptance on 16 held-out prompts (a_1 0.70), where another
16 gave 0.81. This measures acceptance on 64 other held-out prompts (400-463, disjoint from
the sweep's and from s20's 384-399), builds s20's profile with that prior
(`s20@64`), and runs the B=1 sweep (vanilla, static-3, static-4, dynamic) with each
profile in turn, one `run_bench` per profile: the paired dynamic / static-4 ratios within
each run show whether the prior moves them.

    python benchmarks/results/b1_prior/ab.py s20 s20@64 s20 s20@64 > ab.log
"""

import argparse
import dataclasses
import json

from dsd_jax import SpecConfig, SpecEngine, bench
from dsd_jax.bench.settings import FULL
from dsd_jax.loading import encode_prompts
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile
from dsd_jax.profiler import _measure_acceptance

ROOT = "benchmarks/results"


def with_prior(prof: Profile, target, draft, tokenizer, prompts) -> Profile:
    """`prof` with its acceptance measured again (greedy) on `prompts` (cut to the bench's
    prompt length, as the bench's profile does) by an engine of the bench's shape."""
    prompts = [p[:FULL["prompt_len"]] for p in encode_prompts(prompts, tokenizer, target.config.vocab_size)]
    engine = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=FULL["max_k"]),
                        max_batch_size=16, batch_buckets=[16], max_seq_len=FULL["max_seq_len"], tokenizer=tokenizer)
    # 16 at a time (the engine's batch); pooled per position as the plain mean of the chunks
    acc = [_measure_acceptance(engine, prompts[i:i + 16], 0.0, FULL["profile_max_tokens"])[0]
           for i in range(0, len(prompts), 16)]
    pooled = [sum(a[j] for a in acc) / len(acc) for j in range(len(acc[0]))]
    print(f"acceptance on {len(prompts)} prompts: {[round(x, 3) for x in pooled]} "
          f"(chunks: {[[round(x, 2) for x in a[:3]] for a in acc]})", flush=True)
    return dataclasses.replace(prof, acceptance=pooled, acceptance_by_temperature={"0.0": pooled})


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="+", help="bench_full_<NAME>.profile.json names (NAME@64: with the 64-prompt prior)")
    ap.add_argument("--batch-sizes", default="1")
    ap.add_argument("--configs", default="vanilla,static-3,static-4,dynamic")
    ap.add_argument("--out", default="ab.json")
    args = ap.parse_args(argv)
    target, draft, tokenizer = builtin()
    held = heldout_prompts(464)
    prompts = held[:80]
    profiles = {}
    for name in dict.fromkeys(args.profiles):
        base = Profile.load(f"{ROOT}/bench_full_{name.split('@')[0]}.profile.json")
        profiles[name] = (with_prior(base, target, draft, tokenizer, held[400:464])
                          if name.endswith("@64") else base)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    configs = args.configs.split(",")
    out = {}
    for i, name in enumerate(args.profiles):
        rows = bench.run_bench(target, draft, tokenizer, prompts, batch_sizes=sizes, configs=configs,
                               repeats=6, rows_per_point=8, batch_buckets=[b for b in (1, 2, 4) if b <= max(sizes)],
                               workloads=("sweep",), profile=profiles[name], log=None)
        for r in rows:
            if r["workload"] == "sweep" and r["config"] == "dynamic":
                key = f"{i}:{name}:B={r['batch_size']}"
                out[key] = {"vs_best_static": r["vs_best_static"], "best_static": r["best_static"],
                            "vs_vanilla": r["vs_vanilla"], "k_hist": r["k_hist"]}
                v, w = r["vs_best_static"], r["vs_vanilla"]
                print(f"{key}: / {r['best_static']} {v['ratio']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}] (n={v['n']}); "
                      f"/ vanilla {w['ratio']:.3f}; K {r['k_hist']}", flush=True)
    with open(f"{ROOT}/b1_prior/{args.out}", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
