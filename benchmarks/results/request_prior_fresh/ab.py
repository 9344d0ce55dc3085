"""A/B in one bench process (the bench with fresh prompt groups per repeat, 2026-11-27):
`dynamic` runs the library's rows, shrunk at draft 1 toward finished requests' mean c_1
(`RequestAcceptance.shrink_target`); `dynamic-throughput` (relabelled by `controller_ab`:
the same makespan controller) shrinks every rate toward the global, step-weighted
rates, as before. With `all_rates.patch` applied (to 8a000db's acceptance.py; check that out
first), `dynamic` shrinks every rate toward
the finished requests' means (`bench_ab`, `bench_ab2`).

    PYTHONPATH=benchmarks python benchmarks/results/request_prior_fresh/ab.py bench \\
        --configs vanilla,static-1,static-4,dynamic,dynamic-throughput --batch-sizes 1,2,4,8 \\
        --repeats 6 --json benchmarks/results/request_prior_fresh/bench_ab3.json
    python benchmarks/results/conditional_rates/pair.py benchmarks/results/request_prior_fresh/bench_ab3.json \\
        dynamic dynamic-throughput
"""
import sys

import numpy as np
from controller_ab import patched, run_bench_with


def step_weighted_target(controller):
    rq = controller._requests
    if "shrink_target" not in rq.__dict__:
        rq.shrink_target = lambda: np.nan_to_num(rq._global.rates)


sys.exit(run_bench_with(patched(step_weighted_target)))
