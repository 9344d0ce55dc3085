"""A/B in one bench process: `dynamic` prices acceptance probes at a held K = 0 under the
makespan objective with the makespan row at the profile's acceptance (this change);
`dynamic-throughput` (relabelled by `controller_ab`: the same makespan controller) with the
mean row's goodput at the profile's acceptance (before).

    PYTHONPATH=benchmarks python benchmarks/results/makespan_probes/ab.py bench \\
        --configs vanilla,static-1,static-4,dynamic,dynamic-throughput ...
"""
import sys

from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    def _decide(self, b, key, al, prior_al=None):
        return super()._decide(b, key, al)  # the profile's mean-row AL curve, as before


sys.exit(run_bench_with(Before))
