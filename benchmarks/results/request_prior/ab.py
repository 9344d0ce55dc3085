"""A/B in one bench process: `dynamic` shrinks each row's rates toward the mean over
recent finished requests (`RequestAcceptance.shrink_target`, now); `dynamic-throughput`
(relabelled by `controller_ab`: the same makespan controller) toward the global,
step-weighted rates, as before.

    PYTHONPATH=benchmarks python benchmarks/results/request_prior/ab.py bench \\
        --configs vanilla,static-1,static-4,static-6,dynamic,dynamic-throughput ...
"""
import sys

import numpy as np
from controller_ab import patched, run_bench_with


def step_weighted_target(controller):
    rq = controller._requests
    if "shrink_target" not in rq.__dict__:
        rq.shrink_target = lambda: np.nan_to_num(rq._global.rates)


sys.exit(run_bench_with(patched(step_weighted_target)))
