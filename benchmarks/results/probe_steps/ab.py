"""A/B in one bench process, at commit 2c7f533 (whose controller takes `pending_steps` and has
`steps_to_probe`; reverted after this run): `dynamic` counts its probe interval in steps and ends each
dispatch where the next probe falls due (this change); `dynamic-throughput` (relabelled by
`controller_ab`: the same makespan controller) counts it in choices, one per dispatch,
however many rounds the dispatch runs (before).

    PYTHONPATH=benchmarks python benchmarks/results/probe_steps/ab.py bench \
        --configs vanilla,static-4,dynamic,dynamic-throughput ...
"""
import sys

import numpy as np
from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    steps_to_probe = None  # the engine neither passes pending steps nor ends dispatches at probes

    def choose_k(self, batch_size, context_len=None, request_ids=None, remaining=None, pending_steps=0):
        self._since_probe += 1  # a choice is a step
        return super().choose_k(batch_size, context_len, request_ids, remaining)

    def observe(self, k, num_accepted, *args, **kwargs):
        super().observe(k, num_accepted, *args, **kwargs)
        if np.size(num_accepted):
            self._since_probe -= 1  # an observed round is not


sys.exit(run_bench_with(Before))
