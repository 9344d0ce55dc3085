"""A/B in one bench process: `dynamic` shrinks each row's rates toward the mean over
recent finished requests (`RequestAcceptance.shrink_target`, now); `dynamic-throughput`
(relabelled by `controller_ab`: the same makespan controller) toward the global,
step-weighted rates, as before.

    PYTHONPATH=benchmarks python benchmarks/results/request_prior/ab.py bench \\
        --configs vanilla,static-1,static-4,static-6,dynamic,dynamic-throughput ...
"""
import sys

import numpy as np
from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    def _step_weighted_target(self):
        rq = self._requests
        if "shrink_target" not in rq.__dict__:
            rq.shrink_target = lambda: np.nan_to_num(rq._global.rates)

    def choose_k(self, *args, **kwargs):
        self._step_weighted_target()
        return super().choose_k(*args, **kwargs)

    def held_k(self, *args, **kwargs):
        self._step_weighted_target()
        return super().held_k(*args, **kwargs)

    def observe(self, *args, **kwargs):
        self._step_weighted_target()
        return super().observe(*args, **kwargs)


sys.exit(run_bench_with(Before))
