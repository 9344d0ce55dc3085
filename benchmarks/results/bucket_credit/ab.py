"""A/B in one bench process: `dynamic` as shipped (each round's time credited to the batch
bucket its program ran) against `dynamic-throughput`, relabelled here as the same
controller crediting each round to the bucket of the rows still live, as before cc24edb
(a dispatch launched behind another runs at the bucket of rows that just finished).

    PYTHONPATH=benchmarks python benchmarks/results/bucket_credit/ab.py bench \\
        --configs vanilla,static-1,dynamic,dynamic-throughput ...
"""
import sys

from controller_ab import run_bench_with
from dsd_jax.controller import Controller


class LiveRowsCredit(Controller):
    """Before: the engine passed no batch size on one device, so the rows given set it."""

    def observe(self, k, num_accepted, step_time_s=None, request_ids=None, context_len=None,
                batch_size=None):
        return super().observe(k, num_accepted, step_time_s, request_ids, context_len)


sys.exit(run_bench_with(LiveRowsCredit))
