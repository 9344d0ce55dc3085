"""A/B in one bench process: `dynamic` as shipped against `dynamic-throughput`, relabelled
here as the same makespan controller learning its latency online from the run's steps
(`latency_forgetting` 0.05) without exploring (`explore_gap` 0). Since `bench_full_s16`
these are the defaults, so on later code the two configurations are the same controller.

    PYTHONPATH=benchmarks python benchmarks/results/latency_learning/ab.py bench \\
        --configs vanilla,static-1,static-4,dynamic,dynamic-throughput ...
"""
import dataclasses
import sys

from controller_ab import run_bench_with_variant
from dsd_jax.controller import Controller


def learning(runner, ctl):
    """The same controller with latency learning on and exploration off."""
    dyn = dataclasses.replace(ctl.spec.dynamic, latency_forgetting=0.05, explore_gap=0.0)
    engine = runner.by_method["draft_model"]
    return Controller(dataclasses.replace(ctl.spec, dynamic=dyn), ctl.profile, engine.max_batch_size,
                      batch_buckets=engine.batch_buckets)


sys.exit(run_bench_with_variant(learning))
