"""A/B in one bench process: `dynamic` as shipped against `dynamic-throughput`, relabelled
here as the same makespan controller learning its latency online from the run's steps
(`latency_forgetting` 0.05) without exploring (`explore_gap` 0).

    PYTHONPATH=benchmarks python benchmarks/results/latency_learning/ab.py bench \\
        --configs vanilla,static-1,static-4,dynamic,dynamic-throughput ...
"""
import dataclasses
import sys

from dsd_jax.bench import runner as R
from dsd_jax.bench.settings import DYNAMIC_OBJECTIVES
from dsd_jax.controller import Controller

DYNAMIC_OBJECTIVES["dynamic-throughput"] = "makespan"
orig = R.Runner.controller


def controller(self, config):
    ctl = orig(self, config)
    if config == "dynamic-throughput" and not getattr(ctl, "_learning", False):
        dyn = dataclasses.replace(ctl.spec.dynamic, latency_forgetting=0.05, explore_gap=0.0)
        engine = self.by_method["draft_model"]
        new = Controller(dataclasses.replace(ctl.spec, dynamic=dyn), ctl.profile, engine.max_batch_size,
                         batch_buckets=engine.batch_buckets)
        new._learning = True
        self._dynamic[config] = new
        return new
    return ctl


R.Runner.controller = controller
from dsd_jax.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
