"""A stale draft as the policy moves: dynamic K against K=0 and a static K, then
distillation's recovery.

RL moves the target every step while the draft stays as it was. This simulates that with
the built-in pair: every target matrix drifts along one fixed random direction,
`W_s = W_0 + s * std(W_0) * eps`, for each drift level s. At each level:

- acceptance: mean committed tokens per row-step at a static K on the benchmark prompts
  (1.0 = every draft rejected), at each temperature;
- speed: K=0 (plain decoding: the draft is not run), static K and the goodput controller,
  interleaved (order rotated every unit) and paired per (repeat, temperature, batch),
  drafter-invariant so all three produce the same tokens (checked) and every ratio
  compares the same work. Ratios are geometric means of paired tokens/s ratios with
  bootstrap 95% intervals (`dsd_jax.stats`). B=1 runs the prompts one request at a time,
  B=8 all at once. The dynamic controller is one object per (temperature, batch) that
  lives through every level, as a rollout engine's does through an RL run: it has to
  notice the acceptance fall by itself.

Then, at the most stale level, `dsd_jax.distill.DraftDistiller` trains the draft on
rollouts of *other* prompts (held out from the benchmark prompts) against the moved
target, and the stale level is measured once more with the distilled draft.

    python benchmarks/draft_staleness.py --out benchmarks/results/draft_staleness/draft_staleness.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, stats
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.distill import DraftDistiller
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile
from dsd_jax.profiler import profile_engine
from suffix_rollout import Static  # noqa: E402  (a fixed-K controller; same folder)

EOS = 0
CONFIGS = ("k0", "static", "dynamic")


def drifted(params, level: float, seed: int = 0):
    leaves = jax.tree.leaves(params)
    keys = iter(jax.random.split(jax.random.key(seed), len(leaves)))
    return jax.tree.map(lambda x: x + level * jnp.std(x) * jax.random.normal(next(keys), x.shape,
                                                                               x.dtype)
                        if x.ndim == 2 else x, params)


def parse_floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


class Bench:
    """The engine, its controllers and the timed runs."""

    def __init__(self, args):
        self.args = args
        target, draft, tok = builtin()
        self.target, self.draft = target, draft
        self.prompts = heldout_prompts(args.prompts, num_lines=4, seed=5)
        self.distill_prompts = heldout_prompts(args.prompts, num_lines=4, seed=6)
        self.engine = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=args.k,
                                                           acceptance="drafter_invariant"),
                                 max_batch_size=max(args.batches), max_seq_len=256, tokenizer=tok,
                                 prefill_chunk=128, batch_buckets=tuple(sorted(set(args.batches))))
        self.engine.warmup()
        self.base = nnx.state(target)
        # one profile per temperature, as a user sampling at T would make it: step times
        # taken sampling at T (a sampled step draws noise too) and acceptance at T
        profiles = {t: self.profile(t) for t in args.temperatures}
        spec = SpecConfig(method="draft_model", num_speculative_tokens=args.k,
                          acceptance="drafter_invariant", dynamic=DynamicConfig())
        # one controller per (temperature, batch), living through every level
        self.dynamic = {(t, b): Controller(spec, profiles[t], max_batch_size=max(args.batches),
                                           batch_buckets=self.engine.batch_buckets)
                        for t in args.temperatures for b in args.batches}

    def profile(self, temperature: float) -> Profile:
        args = self.args
        base, ext = os.path.splitext(args.profile or os.path.splitext(args.out)[0] + ".profile.json")
        path = f"{base}.T{temperature:g}{ext}"
        if args.profile:
            profile = Profile.load(path)
        else:
            # acceptance on the distillation prompts: representative, yet not the measured ones
            # (random prompts would set a prior so low that B=1 never even probes K > 0)
            profile = profile_engine(self.engine, context_lengths=(96,), repeats=7, warmup_reps=2,
                                     prompts=self.distill_prompts, acceptance_max_tokens=32,
                                     temperatures=(temperature,), latency_temperature=temperature)
            profile.save(path)
        for b in args.batches:  # the latencies every dynamic choice rests on
            print(f"T={temperature:g} profile ITL ms at B={b}: " + ", ".join(
                f"K{k} {profile.itl_ms(b, k):.1f}" for k in range(args.k + 1)), flush=True)
        return profile

    def sampling(self, temperature: float, seed: int):
        return SamplingParams(temperature=temperature, max_tokens=self.args.max_tokens,
                              stop_token_ids=(EOS,), seed=seed)

    def run(self, controller, temperature: float, batch: int, seed: int, prompts=None):
        """One timed unit: the prompts in calls of `batch` requests. Returns (tokens per
        request, tokens/s, mean accepted length, K histogram)."""
        prompts = self.prompts if prompts is None else prompts
        engine = self.engine
        engine.controller = controller
        engine.stats.reset()
        outs = []
        t = time.perf_counter()
        for i in range(0, len(prompts), batch):
            outs += engine.generate(prompts[i:i + batch], self.sampling(temperature, seed + i))
        wall = time.perf_counter() - t
        m = engine.metrics()
        tokens = [o.token_ids for o in outs]
        return tokens, sum(map(len, tokens)) / wall, m["mean_accepted_len"], m["k_hist"]

    def level(self, name: str, drift: float) -> dict:
        """Acceptance and the paired speed comparison at one drift level."""
        args = self.args
        acceptance = {t: self.run(Static(args.k), t, max(args.batches), seed=1)[2]
                      for t in args.temperatures}
        cells = {(t, b): {c: [] for c in CONFIGS} for t in args.temperatures for b in args.batches}
        hist = {key: collections.Counter() for key in cells}
        mismatches, turn = 0, 0
        for rep in range(args.repeats):
            for (t, b), cell in cells.items():
                ctl = {"k0": Static(0), "static": Static(args.k), "dynamic": self.dynamic[(t, b)]}
                order = CONFIGS[turn % 3:] + CONFIGS[:turn % 3]
                turn += 1
                got = {}
                for c in order:
                    tokens, tps, _, k_hist = self.run(ctl[c], t, b, seed=100 + 1000 * rep)
                    cell[c].append(tps)
                    got[c] = tokens
                    if c == "dynamic":
                        hist[(t, b)].update(k_hist)
                mismatches += sum(a != r for c in ("static", "dynamic") for a, r in zip(got[c], got["k0"]))
        rows = []
        for (t, b), cell in cells.items():
            row = {"temperature": t, "batch": b, "accepted_len_static_k": acceptance[t],
                   "tokens_per_s_median": {c: sorted(v)[len(v) // 2] for c, v in cell.items()},
                   "dynamic_over_k0": stats.paired_ratio(cell["dynamic"], cell["k0"]),
                   "static_over_k0": stats.paired_ratio(cell["static"], cell["k0"]),
                   "dynamic_k_hist": dict(sorted(hist[(t, b)].items())), "tokens_per_s": cell}
            rows.append(row)
            print(f"{name:>16} T={t:g} B={b}: AL(K={args.k}) {acceptance[t]:.2f}  dynamic/K0 "
                  f"{stats.format_ratio(row['dynamic_over_k0'], 3)}  static-{args.k}/K0 "
                  f"{stats.format_ratio(row['static_over_k0'], 3)}  dynamic K {row['dynamic_k_hist']}",
                  flush=True)
        return {"level": name, "drift": drift, "rows": rows, "mismatches_vs_k0": mismatches}

    def distill(self) -> list[dict]:
        """Rollouts of the held-out distillation prompts, then a few AdamW steps, per round."""
        distiller = DraftDistiller(self.target, self.draft, learning_rate=1e-3, rows=8, temperature=1.0)
        log = []
        for r in range(self.args.distill_rounds):
            self.engine.controller = Static(self.args.k)
            outs = self.engine.generate(self.distill_prompts, SamplingParams(
                temperature=1.0, max_tokens=self.args.max_tokens, stop_token_ids=(EOS,), seed=500 + r, n=2))
            t = time.perf_counter()
            m = distiller.refresh(self.engine, outs, steps=self.args.distill_steps)
            m["seconds"] = time.perf_counter() - t
            log.append(m)
            print(f"distill round {r}: KL {m['loss_before']:.3f} -> {m['loss_after']:.3f} "
                  f"({m['seconds']:.1f}s)", flush=True)
        return log


def summarize(levels: list[dict]) -> dict:
    rows = [(lv["level"], r) for lv in levels for r in lv["rows"]]
    worst_name, worst = min(rows, key=lambda x: x[1]["dynamic_over_k0"]["ratio"])
    acc = {lv["level"]: {r["temperature"]: r["accepted_len_static_k"] for r in lv["rows"]} for lv in levels}
    return {
        "accepted_len_static_k": acc,
        "worst_dynamic_over_k0": {"level": worst_name, "temperature": worst["temperature"],
                                  "batch": worst["batch"], **worst["dynamic_over_k0"]},
        "dynamic_resolvably_below_0.95x_k0": any(
            r["dynamic_over_k0"]["hi"] is not None and r["dynamic_over_k0"]["hi"] < 0.95 for _, r in rows),
        "mismatches_vs_k0": sum(lv["mismatches_vs_k0"] for lv in levels),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--levels", type=parse_floats, default=[0, 0.15, 0.3, 0.6], help="drift per level (x std)")
    ap.add_argument("--temperatures", type=parse_floats, default=[0.0, 1.0])
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--k", type=int, default=3, help="max K (and the static K)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--distill-steps", type=int, default=24)
    ap.add_argument("--distill-rounds", type=int, default=2, help="rollout + distill rounds at the last level")
    ap.add_argument("--profile", help="saved profiles of this engine, PATH.T<temperature>.json for each "
                    "temperature (default: profile it now and save them beside --out)")
    ap.add_argument("--out", default="draft_staleness.json")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    bench = Bench(args)
    levels = []
    for drift in args.levels:
        bench.engine.set_params(target=drifted(bench.base, drift))
        levels.append(bench.level(f"drift {drift:g}", drift))
    log = bench.distill()
    levels.append(bench.level(f"drift {args.levels[-1]:g} distilled", args.levels[-1]))

    summary = summarize(levels)
    print(json.dumps(summary, indent=1))
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "summary": summary, "levels": levels, "distill": log,
                   "seconds_total": time.perf_counter() - t_start}, f, indent=1)
    print(f"wrote {args.out} ({time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
