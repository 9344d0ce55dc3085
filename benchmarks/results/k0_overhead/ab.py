"""Where dynamic's K = 0 steps lose to vanilla's at large B, in one bench process.

`bench_full_s20`/`s21` had dynamic at 0.97-1.00x of vanilla at B = 32-64 while it ran
K = 0 in every step, its K = 0 steps 1-7% slower than vanilla's (25.4 against 23.8 ms at
B = 64 in s21). The two K = 0 programs compile to the same HLO but for the drafter's
state passed through (aliased), so the difference is in how they are driven. Here
`dynamic-throughput` is relabelled (`controller_ab`) as the draft-model engine under a
fixed K = 0 controller (plain decoding's schedule: settled, 32 rounds a dispatch, no
per-row estimates): vanilla against it is the engine, it against dynamic is the controller
and its dispatch pattern.

    PYTHONPATH=benchmarks python benchmarks/results/k0_overhead/ab.py bench \\
        --configs vanilla,dynamic,dynamic-throughput --batch-sizes 16,64 --repeats 6 \\
        --profile benchmarks/results/bench_full_s21.profile.json --json benchmarks/results/k0_overhead/ab.json
    python benchmarks/results/conditional_rates/pair.py benchmarks/results/k0_overhead/ab.json dynamic dynamic-throughput
"""
import sys

from controller_ab import run_bench_with_variant
from dsd_jax.config import SpecConfig
from dsd_jax.controller import Controller


def fixed_k0(runner, ctl):
    engine = runner.by_method["draft_model"]
    return Controller(SpecConfig(method="none"), None, engine.slots_per_shard, batch_buckets=engine.batch_buckets)


sys.exit(run_bench_with_variant(fixed_k0))
