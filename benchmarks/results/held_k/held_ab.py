"""A/B in one bench process: `dynamic` prefills the draft at admission when the controller
would hold K > 0 there (`Controller.held_k`, this change); `dynamic-throughput`: the same
makespan controller prefilling where the goodput row's bare argmax is K > 0 (before).

    PYTHONPATH=benchmarks python benchmarks/results/held_k/held_ab.py bench \
        --configs vanilla,dynamic,dynamic-throughput ...
"""
import sys

import numpy as np
from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    def held_k(self, batch_size, context_len=None):
        return int(np.argmax(self.predicted_goodput(batch_size, context_len)))


sys.exit(run_bench_with(Before))
