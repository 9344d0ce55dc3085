"""A/B in one bench process: `dynamic` = cost-scaled acceptance probes (this change);
`dynamic-throughput`: the makespan controller with probes every probe_interval (before).

    PYTHONPATH=benchmarks python benchmarks/results/probe_cost/probe_ab.py bench \
        --configs vanilla,dynamic,dynamic-throughput ...
"""
import sys

import numpy as np
from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    def _acceptance_probe(self, g_prior, itl):
        k, every = super()._acceptance_probe(g_prior, itl)
        return k, np.full_like(every, self._probe_interval)


sys.exit(run_bench_with(Before))
