"""The replay of today's bench: each sweep prompt once, in random orders, through one controller.

Since 2026-11-27 the bench gives every repeat prompt groups of its own, so at B = 1 a
controller meets 48 prompts one after another, never the same one twice; `sim.py`
replays the older bench (the same 8 prompts every repeat). This runs the 64 prompts of
`sweep.json` in groups of B, each once, in `--orders` random orders, and prints K = 0's
time over each configuration's (geometric mean over orders [lowest, highest]):

    PYTHONPATH=. python sequence.py sweep.json ../bench_full_s20.profile.json --batch-sizes 1,2,4,8
    PYTHONPATH=. python sequence.py sweep.json ../bench_full_s20.profile.json --trace 0

`--step-ratios BENCH_LOG`: steps cost the profile's ITL times the step-time ratios that
run's controller learnt (`step_times.py`), where the controllers price with the profile.
`--dispatch-ms MS`: each dispatch costs MS beside its rounds (~1.35 on XLA:CPU, measured
in the engine: `../controller_host/`). `--variants held=0,stable=2`: dynamic with those
changes beside it (`variant`). `--step-weighted`: `dynamic-old` beside `dynamic`, its rows
shrunk toward the global (step-weighted) rates as before `RequestAcceptance.shrink_target`.
`--trace N`: order N at B = 1, prompt by prompt: dynamic's time and K per step beside static K = 4's and the best
static K's (m: how many drafts from each position the target accepts).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

import sim
from dsd_jax.dispatch import DispatchPolicy
from dsd_jax.profile import Profile
from step_times import learnt_ratios, measured_profile

STATIC = (0, 1, 2, 3, 4, 5, 6)


def step_weighted(ctl):
    """The controller with its rows shrunk toward the global rates (the rule before)."""
    rq = ctl._requests
    rq.shrink_target = lambda: np.nan_to_num(rq._global.rates)
    return ctl


def total_ms(ctl, sweep, order, b, profile, trace=None) -> float:
    ag, lens = sweep["agreement"], sweep["prompt_lens"]
    t = 0.0
    for start in range(0, len(order) - b + 1, b):
        g = order[start:start + b]
        steps = [] if trace is not None else None
        ms = sim.run_unit(ctl, [ag[j] for j in g], [lens[j] for j in g], list(range(start, start + b)),
                          [64] * b, profile, trace=steps)
        if trace is not None:
            trace.append((g, ms, steps))
        t += ms
    return t


class VariantPolicy(DispatchPolicy):
    """The engine's dispatch policy with `stable_decisions` equal choices before a dispatch
    may run several rounds, and (`held_with_several_rows` False) the held K's rounds for
    lone rows only, as before s30."""

    held_with_several_rows = True

    def rounds(self, live, k, *args, **kwargs):
        self._several = len(live) > 1
        return super().rounds(live, k, *args, **kwargs)

    def _holds(self, k):
        return (self.held_with_several_rows or not self._several) and super()._holds(k)


def variant(profile, spec: str):
    """A factory of dynamic with `spec`'s changes, e.g. "margin=0.06" (a `DynamicConfig`
    field), "stable=2" (equal choices before a dispatch may run several rounds; the
    engine's `dispatch.STABLE_DECISIONS`) or "held=0" (the held K's rounds for lone rows
    only, as before s30), joined by "+"."""
    fields, dispatch = {}, {}
    for part in spec.split("+"):
        name, value = part.split("=")
        if name == "stable":
            dispatch["stable_decisions"] = int(value)
        elif name == "held":
            dispatch["held_with_several_rows"] = bool(int(value))
        else:
            fields[name] = float(value)

    return sim.with_policy(lambda: sim.make_dynamic(profile, **fields), type("Variant", (VariantPolicy,), dispatch))


def configs(profile, old: bool, variants=()):
    out = {f"static-{k}": (lambda k=k: sim.static_controller(k)) for k in STATIC}
    out["dynamic"] = lambda: sim.make_dynamic(profile)
    if old:
        out["dynamic-old"] = lambda: step_weighted(sim.make_dynamic(profile))
    for spec in variants:
        out[f"dynamic[{spec}]"] = variant(profile, spec)
    return out


def summary(sweep, profile, b, orders, variants, steps_at=None) -> str:
    """K = 0's time over each variant's (name -> controller factory; "static-0" among them),
    geometric mean over `orders` random orders [lowest, highest]. `steps_at`: the profile
    whose ITL the steps cost (`step_times.measured_profile`), where the controllers price
    with theirs; None: `profile`."""
    n = len(sweep["agreement"])
    times = {name: [] for name in variants}
    for seed in range(orders):
        order = np.random.default_rng(100 + seed).permutation(n)
        for name, make in variants.items():
            times[name].append(total_ms(make(), sweep, order, b, profile if steps_at is None else steps_at))
    k0 = np.array(times["static-0"])
    parts = []
    for name, v in times.items():
        r = k0 / np.array(v)
        parts.append(f"{name} {np.exp(np.log(r).mean()):.3f} [{r.min():.2f},{r.max():.2f}]")
    return f"B={b}: " + "  ".join(parts)


def trace(sweep, profile, seed, old) -> None:
    ag, lens = sweep["agreement"], sweep["prompt_lens"]
    n = len(ag)
    static = np.array([[sim.run_unit(sim.static_controller(k), [ag[j]], [lens[j]], [0], [64], profile)
                        for k in STATIC] for j in range(n)])
    order = np.random.default_rng(100 + seed).permutation(n)
    ctl = sim.make_dynamic(profile)
    if old:
        step_weighted(ctl)
    steps = []
    total = total_ms(ctl, sweep, order, 1, profile, trace=steps)
    for i, ((j,), ms, tr) in enumerate(steps):
        ks = "".join(str(k) for k, _, _ in tr)
        print(f"{i:2d} prompt {j:2d}: dynamic {ms:6.1f} ms, static-4 {static[j, 4]:6.1f}, best {static[j].min():6.1f} "
              f"(K={static[j].argmin()}); m {''.join(str(min(x, 9)) for x in ag[j][:40])}; K {ks[:60]}")
    print(f"total: dynamic {total:.0f} ms, static-4 {static[:, 4].sum():.0f}, per-prompt best {static.min(1).sum():.0f}, "
          f"K=0 {static[:, 0].sum():.0f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("profile")
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--orders", type=int, default=8)
    ap.add_argument("--step-weighted", action="store_true", help="also dynamic-old: rows shrunk toward the global rates")
    ap.add_argument("--trace", type=int, default=None, help="trace this order at B = 1 instead")
    ap.add_argument("--step-ratios", metavar="BENCH_LOG",
                    help="steps cost the profile's ITL times the learnt step-time ratios in this bench log "
                         "(step_times.py); the controllers still price with the profile")
    ap.add_argument("--step-ratios-config", default="dynamic-throughput",
                    help="whose learnt table to read from BENCH_LOG")
    ap.add_argument("--dispatch-ms", type=float, default=sim.DISPATCH_MS,
                    help="a dispatch's own cost beside its rounds (~1.35 measured on XLA:CPU in the engine)")
    ap.add_argument("--variants", default="",
                    help="dynamic variants beside it, comma-separated, e.g. held=0,stable=2 (`variant`)")
    args = ap.parse_args()
    sim.DISPATCH_MS = args.dispatch_ms
    sweep = json.load(open(args.sweep))
    profile = Profile.load(args.profile)
    if args.trace is not None:
        trace(sweep, profile, args.trace, args.step_weighted)
        return
    steps_at = None
    if args.step_ratios:
        steps_at = measured_profile(args.profile, learnt_ratios(args.step_ratios, args.step_ratios_config))
    for b in (int(x) for x in args.batch_sizes.split(",")):
        print(summary(sweep, profile, b, args.orders, configs(profile, args.step_weighted,
                                                                   [v for v in args.variants.split(",") if v]), steps_at), flush=True)


if __name__ == "__main__":
    main()
