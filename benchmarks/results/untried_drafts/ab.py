"""A/B in one bench process: `dynamic` credits a row's never-proposed drafts with at least
its rate at the last draft it proposed (`RequestAcceptance._untried_at_least_last`, now);
`dynamic-throughput` (relabelled by `controller_ab`: the same makespan controller) takes
the global rate there, as before.

    PYTHONPATH=benchmarks python benchmarks/results/untried_drafts/ab.py bench \\
        --configs vanilla,static-1,static-4,static-6,dynamic,dynamic-throughput ...
"""
import sys

from controller_ab import patched, run_bench_with


def global_rates_beyond_k(controller):
    rq = controller._requests
    if "_untried_at_least_last" not in rq.__dict__:
        rq._untried_at_least_last = lambda own, rows, k: own


sys.exit(run_bench_with(patched(global_rates_beyond_k)))
