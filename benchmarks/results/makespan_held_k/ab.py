"""A/B in one bench process: under the makespan objective `dynamic` decides whether
admission prefills the drafter by the makespan row of the live requests (`held_k` given
the request ids and budgets: this change); `dynamic-throughput` (relabelled by
`controller_ab`: the same makespan controller) by the batch mean's goodput row (before).

    PYTHONPATH=benchmarks python benchmarks/results/makespan_held_k/ab.py bench \\
        --configs vanilla,dynamic,dynamic-throughput ...
"""
import sys

from controller_ab import run_bench_with

from dsd_jax.controller import Controller


class Before(Controller):
    def held_k(self, batch_size, context_len=None, request_ids=None, remaining=None):
        return super().held_k(batch_size, context_len)  # the batch mean's row, as before


sys.exit(run_bench_with(Before))
