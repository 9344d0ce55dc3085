"""A/B in one bench process (2026-11-27), run at 9357cde, whose controller held the rule
(`fresh_row_rule.patch`, reverted since): under the makespan objective a held K = 0 runs
K = 1 while a live request is fresh and the profile's acceptance says speculating pays
(`Controller._fresh_row_worth_a_draft`). `dynamic` is that controller;
`dynamic-throughput` (relabelled by `controller_ab`: the same makespan controller) holds
K = 0 as before. To rerun it, apply the patch first (`git apply fresh_row_rule.patch`).

    PYTHONPATH=benchmarks python benchmarks/results/fresh_row_draft/ab.py bench \\
        --configs vanilla,static-1,dynamic,dynamic-throughput --batch-sizes 4,8 \\
        --repeats 12 --json benchmarks/results/fresh_row_draft/bench_ab.json
    python benchmarks/results/conditional_rates/pair.py benchmarks/results/fresh_row_draft/bench_ab.json \\
        dynamic dynamic-throughput
"""
import sys

from controller_ab import run_bench_with
from dsd_jax.controller import Controller


class Before(Controller):
    def _fresh_row_worth_a_draft(self, *args, **kwargs) -> bool:
        return False


sys.exit(run_bench_with(Before))
