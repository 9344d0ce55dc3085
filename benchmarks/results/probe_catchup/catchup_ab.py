"""A/B in one bench process, at commit 64b7153 (whose `Controller._acceptance_probe` takes the
catch-up cell): `dynamic` spaces acceptance probes charging the draft's catch-up (the
change); `dynamic-throughput`: the same makespan controller spacing them by the step cost
alone (before).

    PYTHONPATH=benchmarks python benchmarks/results/probe_catchup/catchup_ab.py bench \
        --configs vanilla,dynamic,dynamic-throughput ...
"""
import sys

from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    def _acceptance_probe(self, g_prior, itl, catchup_ms=None):
        return super()._acceptance_probe(g_prior, itl, None)


sys.exit(run_bench_with(Before))
