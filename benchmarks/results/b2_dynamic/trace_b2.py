"""Where dynamic loses to static-4 at B=2 in bench_full_s27 (0.95x [0.90, 0.99]*) while its
decode-only tokens/s is higher (356 against 347): every B=2 sweep call traced
(`EngineStats.trace`), each call's wall split into its first dispatch (after the prefill,
which it carries), the decode steps, and what the trace does not see (host time outside
the steps: generate's setup, prefill dispatch, output assembly).

    python benchmarks/results/b2_dynamic/trace_b2.py [repeats] [--after-b1] > trace_b2[_after_b1].log
    python benchmarks/results/b2_dynamic/trace_b2.py --summarise trace_b2.json   (a saved trace)

--after-b1 runs the B=1 point first, as the full bench does: every configuration's
controller then reaches B=2 with what it learnt at B=1. --all-buckets compiles the full
bench's batch buckets (1-64) and slots (64), not 1 and 2.
"""

import collections
import json
import statistics
import sys
import time

from dsd_jax import bench
from dsd_jax.controller import Controller
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile

CONFIGS = ["vanilla", "static-4", "dynamic"]
calls = collections.defaultdict(list)  # config -> per call: dict
host = collections.Counter()  # controller method -> seconds spent in it (this call)


def timed(name):
    method = getattr(Controller, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            host[name] += time.perf_counter() - t0

    setattr(Controller, name, wrapper)


def hook(runner):
    run = runner.run
    for name in ("choose_k", "observe", "held_k", "settled"):
        timed(name)

    def traced(config, prompts, sampling):
        host.clear()
        wall, toks, info = run(config, prompts, sampling)  # it resets the engine's stats first
        if len(prompts) == 2 and not isinstance(sampling, list):  # the timed B=2 sweep calls
            tr = list(runner.engine_for(config).stats.trace)
            calls[config].append({"wall_ms": wall * 1e3, "host_ms": {k: v * 1e3 for k, v in host.items()},
                                  "steps": [(s["k"], s["wall_ms"], s["after_prefill"], s["emitted"]) for s in tr]})
        return wall, toks, info

    runner.run = traced


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def lone_and_batched(steps) -> dict:
    """Decode rounds' ms by (K, "lone" or "batched"): rounds of one dispatch share its wall
    time exactly, so equal consecutive times of one K are one dispatch."""
    out = collections.defaultdict(list)
    steps = [s for s in steps if not s[2]]
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1][0] == steps[i][0] and steps[j + 1][1] == steps[i][1]:
            j += 1
        out[(steps[i][0], "batched" if j > i else "lone")] += [steps[i][1]] * (j - i + 1)
        i = j + 1
    return out


def summarise(calls):
    for c in CONFIGS:
        per = calls[c]
        wall = [p["wall_ms"] for p in per]
        traced = [sum(w for _, w, _, _ in p["steps"]) for p in per]
        first = [sum(w for _, w, a, _ in p["steps"] if a) for p in per]
        first_n = [sum(e for _, _, a, e in p["steps"] if a) for p in per]
        decode = [sum(w for _, w, a, _ in p["steps"] if not a) for p in per]
        first_k = collections.Counter(k for p in per for k, _, a, _ in p["steps"] if a)
        ks = collections.Counter(k for p in per for k, _, a, _ in p["steps"] if not a)
        hosts = {k: med([p["host_ms"].get(k, 0.0) for p in per]) for k in ("choose_k", "observe", "held_k", "settled")}
        print(f"{c}: {len(per)} calls; per call (median): wall {med(wall):.1f} ms, traced {med(traced):.1f}, "
              f"untraced {med([w - t for w, t in zip(wall, traced)]):.1f}, first dispatch {med(first):.1f} ms "
              f"emitting {med(first_n)} (K {dict(sorted(first_k.items()))}), decode steps {med(decode):.1f} ms; "
              f"decode K {dict(sorted(ks.items()))}; controller host ms {({k: round(v, 2) for k, v in hosts.items()})}")
        bykd = collections.defaultdict(list)
        for p in per:
            for k, w, a, e in p["steps"]:
                if not a:
                    bykd[k].append(w)
        print("   decode step ms by K (median, n):", {k: (round(med(v), 2), len(v)) for k, v in sorted(bykd.items())})
        split = collections.defaultdict(list)
        for p in per:
            for key, v in lone_and_batched(p["steps"]).items():
                split[key] += v
        lone = sum(len(v) for (_, kind), v in split.items() if kind == "lone")
        print(f"   lone rounds {lone} of {sum(map(len, split.values()))}; ms by (K, dispatch) (median, n):",
              {f"{k} {kind}": (round(med(v), 2), len(v)) for (k, kind), v in sorted(split.items())})
        print("   call 0", [(k, round(w, 1), int(a), e) for k, w, a, e in per[0]["steps"]])



def main():
    if "--summarise" in sys.argv:
        with open(sys.argv[sys.argv.index("--summarise") + 1]) as f:
            return summarise(json.load(f))
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    after_b1 = "--after-b1" in sys.argv
    repeats = int(args[0]) if args else 6
    buckets = [1, 2, 4, 8, 16, 32, 64] if "--all-buckets" in sys.argv else [1, 2]
    target, draft, tokenizer = builtin()
    prof = Profile.load("benchmarks/results/bench_full_s27.profile.json")
    rows = bench.run_bench(target, draft, tokenizer, heldout_prompts(615), configs=CONFIGS,
                           batch_sizes=[1, 2] if after_b1 else [2], repeats=repeats, batch_buckets=buckets,
                           workloads=("sweep",), profile=prof,
                           runner_hook=hook, log=None)
    tag = ("_after_b1" if after_b1 else "") + ("_all_buckets" if len(buckets) > 2 else "")
    with open(f"benchmarks/results/b2_dynamic/trace_b2{tag}.json", "w") as f:
        json.dump(calls, f)
    for r in rows:
        if "config" not in r or r["batch_size"] != 2:
            continue
        vb = r.get("vs_best_static") or {}
        print(f"{r['config']}: {r['tokens_per_s']:.1f} tok/s, decode-only {r['decode_tokens_per_s']:.1f}, "
              f"vs static-4 {vb.get('ratio', float('nan')):.3f} [{vb.get('lo', float('nan')):.3f}, "
              f"{vb.get('hi', float('nan')):.3f}], k_hist {r['k_hist']}")
    summarise(calls)

if __name__ == "__main__":
    main()
