"""A/B in one bench process: `dynamic` credits a row's never-proposed drafts with at least
its rate at the last draft it proposed (`RequestAcceptance._untried_at_least_last`, now);
`dynamic-throughput` (relabelled by `controller_ab`: the same makespan controller) takes
the global rate there, as before.

    PYTHONPATH=benchmarks python benchmarks/results/untried_drafts/ab.py bench \\
        --configs vanilla,static-1,static-4,static-6,dynamic,dynamic-throughput ...
"""
import sys

from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    def _global_rates_beyond_k(self):
        if "_untried_at_least_last" not in self._requests.__dict__:
            self._requests._untried_at_least_last = lambda own, rows, k: own

    def choose_k(self, *args, **kwargs):
        self._global_rates_beyond_k()
        return super().choose_k(*args, **kwargs)

    def held_k(self, *args, **kwargs):
        self._global_rates_beyond_k()
        return super().held_k(*args, **kwargs)

    def observe(self, *args, **kwargs):
        self._global_rates_beyond_k()
        return super().observe(*args, **kwargs)


sys.exit(run_bench_with(Before))
