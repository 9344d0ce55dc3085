"""A GRPO-like rollout, two epochs, with the built-in pair: which drafter pays?

8 held-out prompts x G=8 completions at temperature 1 (`SamplingParams(n=8)`), max tokens
heavy-tailed per prompt (lognormal, capped), stopping at end-of-text; then a second
"epoch" on the same prompts with new seeds. Configurations, interleaved in one process
(each repeat runs every configuration once, in a rotated order):

  vanilla; ngram (own tokens); suffix (siblings); suffix (siblings + the previous
  epoch's completions, via RolloutMemory); draft model -- each at a static K and under
  the goodput controller (dynamic), profiled per engine.

Every engine runs drafter-invariant acceptance, so every configuration produces the same
tokens as vanilla (same seeds): the makespans compare the same work, and a mismatch is
counted (it must stay 0).

Reported per configuration and epoch: makespan (the generate call's wall time), tokens/s,
acceptance per draft position, mean committed tokens per row-step, and the makespan ratio
to vanilla paired by repeat (median and range). Epoch 1 of the two suffix variants is the
same run; they differ in epoch 2.

    python benchmarks/suffix_rollout.py --out benchmarks/results/suffix_rollout.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profiler import profile_engine
from dsd_jax.rollout_memory import RolloutMemory

EOS = 0  # the built-in tokenizer's end-of-text id


class Static:
    """K fixed (the controller interface the engine calls)."""

    def __init__(self, k: int):
        self.k = k

    def choose_k(self, batch_size, context_len=None, request_ids=None, remaining=None):
        return self.k

    def observe(self, *args, **kwargs):
        pass


def workload(num_prompts: int, group: int, seed: int):
    rng = np.random.default_rng(seed)
    budgets = np.minimum(np.round(rng.lognormal(np.log(48), 0.8, num_prompts)), 192).astype(int)
    prompts = heldout_prompts(num_prompts, num_lines=6, seed=seed)
    return prompts, [max(int(b), 8) for b in budgets]


def sampling(budgets, group: int, epoch: int):
    return [SamplingParams(temperature=1.0, max_tokens=b, n=group, stop_token_ids=(EOS,),
                           seed=1000 * epoch + 17 * i) for i, b in enumerate(budgets)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--static-k", type=int, default=3)
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--batch-buckets", default="2,8,32,64", help="per-engine batch buckets")
    ap.add_argument("--out", default="suffix_rollout.json")
    args = ap.parse_args(argv)

    target, draft, tok = builtin()
    prompts, budgets = workload(args.prompts, args.group, seed=3)
    slots = args.prompts * args.group
    max_seq = 320
    engines = {}
    for method in ("none", "ngram", "suffix", "draft_model"):
        spec = SpecConfig(method=method, num_speculative_tokens=0 if method == "none" else args.max_k,
                          acceptance="drafter_invariant", prompt_lookup_max=4, suffix_bank_len=2048)
        buckets = sorted({min(int(b), slots) for b in args.batch_buckets.split(",")} | {slots})
        engines[method] = SpecEngine(target, draft if method == "draft_model" else None, spec,
                                     max_batch_size=slots, max_seq_len=max_seq, tokenizer=tok,
                                     prefill_chunk=128, batch_buckets=buckets)
    t0 = time.perf_counter()
    for e in engines.values():
        e.warmup()
    compile_s = time.perf_counter() - t0
    controllers = {}
    for method in ("ngram", "suffix", "draft_model"):
        e = engines[method]
        prof = profile_engine(e, context_lengths=(128,), repeats=3, warmup_reps=1,
                              acceptance_max_tokens=32, temperatures=(1.0,))
        spec = SpecConfig(method=method, num_speculative_tokens=args.max_k,
                          acceptance="drafter_invariant",
                          dynamic=DynamicConfig(per_request=True, objective="throughput"))
        controllers[method] = lambda spec=spec, prof=prof, e=e: Controller(
            spec, prof, max_batch_size=slots, batch_buckets=e.batch_buckets)
    configs = [("vanilla", "none", None, False)]
    for method, name in (("ngram", "ngram"), ("suffix", "suffix-siblings"),
                         ("suffix", "suffix-siblings+prev"), ("draft_model", "draft")):
        memory = name.endswith("+prev")
        configs.append((f"{name} K={args.static_k}", method, "static", memory))
        configs.append((f"{name} dynamic", method, "dynamic", memory))

    runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
    reference: dict[int, list] = {}  # epoch -> vanilla's tokens
    mismatches = 0
    for rep in range(args.repeats):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]
        for name, method, mode, use_memory in order:
            e = engines[method]
            memory = RolloutMemory() if use_memory else None
            epochs = []
            for epoch in (1, 2):
                if method != "none":
                    e.controller = Static(args.static_k) if mode == "static" else controllers[method]()
                e.stats.reset()
                t = time.perf_counter()
                outs = e.generate(prompts, sampling(budgets, args.group, epoch), memory=memory)
                wall = time.perf_counter() - t
                tokens = [o.token_ids for o in outs]
                if method == "none":
                    reference[epoch] = tokens
                elif epoch in reference:
                    mismatches += sum(a != b for a, b in zip(tokens, reference[epoch]))
                m = e.metrics()
                epochs.append({"makespan_s": wall,
                               "tokens": sum(len(o.token_ids) for o in outs),
                               "tokens_per_s": sum(len(o.token_ids) for o in outs) / wall,
                               "mean_accepted_len": m["mean_accepted_len"],
                               "acceptance_per_position": m["acceptance_per_position"],
                               "k_hist": m["k_hist"]})
            runs[name].append(epochs)
            print(f"rep {rep} {name:32s} " + "  ".join(
                f"e{i + 1} {x['makespan_s']:6.2f}s {x['tokens_per_s']:6.1f} tok/s AL {x['mean_accepted_len']:.2f}"
                for i, x in enumerate(epochs)), flush=True)

    summary = []
    for name, reps in runs.items():
        for epoch in (0, 1):
            ratio = [r[epoch]["makespan_s"] / v[epoch]["makespan_s"] for r, v in zip(reps, runs["vanilla"])]
            acc = reps[-1][epoch]["acceptance_per_position"]
            summary.append({
                "config": name, "epoch": epoch + 1,
                "makespan_s": statistics.median(r[epoch]["makespan_s"] for r in reps),
                "tokens_per_s": statistics.median(r[epoch]["tokens_per_s"] for r in reps),
                "mean_accepted_len": statistics.median(r[epoch]["mean_accepted_len"] for r in reps),
                "acceptance_pos1": acc[0] if acc else None,
                "makespan_vs_vanilla": {"median": statistics.median(ratio), "min": min(ratio),
                                        "max": max(ratio)},
                "k_hist": reps[-1][epoch]["k_hist"]})
    print(f"\n{'config':34s} ep  makespan  tok/s   AL    a1    vs vanilla (median [min, max])")
    for s in summary:
        r = s["makespan_vs_vanilla"]
        a1 = "  -  " if s["acceptance_pos1"] is None else f"{s['acceptance_pos1']:.2f}"
        print(f"{s['config']:34s} {s['epoch']}  {s['makespan_s']:7.2f}s {s['tokens_per_s']:6.1f} "
              f"{s['mean_accepted_len']:5.2f} {a1}  {r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}]")
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "budgets": budgets, "compile_s": compile_s,
                   "mismatches_vs_vanilla": mismatches,
                   "summary": summary, "runs": runs}, f, indent=1)
    print(f"completions differing from vanilla's: {mismatches}\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
