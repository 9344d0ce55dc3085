"""Micro-benchmark of the host-side K controller (numpy only; no JAX, no device).

    python benchmarks/controller_bench.py [--number 200000] [--repeat 7] [--json FILE]

Times `Controller.choose_k` per call in goodput mode with a realistic profile
(7 batch sizes 1..64, K 0..6, two context lengths), reporting the median over
repeats of the mean per call (ns). Also times the per-request path and
`observe` (once per step, B = 64) for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

import numpy as np

from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.profile import Profile

BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64]
KS = list(range(7))
CONTEXTS = [256, 2048]


def _forward_ms(tokens: float) -> float:
    # Target forward time vs tokens per forward on XLA:CPU (docs/design.md section 12).
    return float(np.interp(tokens, [1, 8, 32, 256, 4096], [4.6, 5.5, 8.2, 42.0, 42.0 + 0.15 * 3840]))


def realistic_profile() -> Profile:
    def cell(b, k, c):
        return _forward_ms(b * (k + 1)) + k * (1.2 + 0.04 * b) + 0.002 * c * b / 8

    return Profile(
        device_kind="cpu",
        batch_sizes=BATCH_SIZES,
        ks=KS,
        context_lengths=CONTEXTS,
        latency_ms=[[[cell(b, k, c) for k in KS] for b in BATCH_SIZES] for c in CONTEXTS],
        acceptance=[0.8, 0.65, 0.5, 0.4, 0.3, 0.25],
        method="draft_model",
    )


def bench(stmt: str, env: dict, number: int, repeat: int) -> float:
    """Median over `repeat` runs of the mean ns per execution of `stmt`."""
    times = timeit.repeat(stmt, globals=env, number=number, repeat=repeat)
    return statistics.median(times) / number * 1e9


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=200_000, help="calls per repeat")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)

    prof = realistic_profile()
    spec = SpecConfig(num_speculative_tokens=6, dynamic=DynamicConfig())
    c = Controller(spec, prof, max_batch_size=64)
    per = Controller(SpecConfig(num_speculative_tokens=6, dynamic=DynamicConfig(per_request=True)), prof, 64)
    ids16 = [f"r{i}" for i in range(16)]
    ids64 = list(range(64))
    rem64 = list(range(10, 74))
    acc64 = np.random.default_rng(0).integers(0, 5, 64)
    for b in range(1, 65):  # warm the precomputed tables
        c.choose_k(b)
        c.choose_k(b, 1000)
    env = {"c": c, "per": per, "ids16": ids16, "ids64": ids64, "rem64": rem64, "acc64": acc64}
    n, r = args.number, args.repeat
    res = {
        "choose_k_ns": bench("c.choose_k(16)", env, n, r),
        "choose_k_context_ns": bench("c.choose_k(16, 1000)", env, n, r),
        "choose_k_per_request_b16_ns": bench("per.choose_k(16, request_ids=ids16)", env, max(1, n // 20), r),
        "choose_k_makespan_b64_ns": bench("c.choose_k(64, request_ids=ids64, remaining=rem64)", env,
                                          max(1, n // 20), r),
        "observe_b64_ns": bench("c.observe(4, acc64)", env, max(1, n // 20), r),
        "observe_b64_requests_ns": bench("c.observe(4, acc64, request_ids=ids64)", env, max(1, n // 20), r),
        "baseline_empty_call_ns": bench("abs(16)", env, n, r),
    }
    res["mode"] = c.stats()["mode"]
    print(f"choose_k (goodput, B=16, no context)    {res['choose_k_ns']:8.0f} ns/call")
    print(f"choose_k (goodput, B=16, context 1000)  {res['choose_k_context_ns']:8.0f} ns/call")
    print(f"choose_k (per_request, 16 requests)     {res['choose_k_per_request_b16_ns']:8.0f} ns/call")
    print(f"choose_k (makespan, 64 requests)        {res['choose_k_makespan_b64_ns']:8.0f} ns/call")
    print(f"observe  (k=4, B=64)                    {res['observe_b64_ns']:8.0f} ns/call")
    print(f"observe  (k=4, B=64, with request ids)  {res['observe_b64_requests_ns']:8.0f} ns/call")
    print(f"a bare builtin call, for scale          {res['baseline_empty_call_ns']:8.0f} ns/call")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
