"""A/B in one bench process: `dynamic` estimates acceptance from conditional rates
(`dsd_jax.acceptance` now), `dynamic-throughput` (relabelled by `controller_ab`: the same
makespan controller) from each position's own counts (`counted_acceptance.py`, frozen from
cb940b6).

    PYTHONPATH=benchmarks python benchmarks/results/conditional_rates/ab.py bench \\
        --configs vanilla,static-1,static-4,dynamic,dynamic-throughput ...
"""
import os
import sys

from controller_ab import run_bench_with

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import counted_acceptance as counted  # noqa: E402

from dsd_jax.controller import DEFAULT_FORGETTING, Controller  # noqa: E402


class Before(Controller):
    def _counted(self):
        if not isinstance(self._acc, counted.GlobalAcceptance):  # built as a Controller: swap once
            dyn = self.spec.dynamic
            prior = counted.padded_prior(None if self.profile is None else self.profile.acceptance, self.max_k)
            self._acc = counted.GlobalAcceptance(prior, dyn.forgetting if dyn else DEFAULT_FORGETTING,
                                                 dyn.warmup_steps if dyn else 0)
            self._requests = counted.RequestAcceptance(self._acc)
            self._est_tables = self._acc.estimate.copy()
            self._gtabs.clear()

    def choose_k(self, *args, **kwargs):
        self._counted()
        return super().choose_k(*args, **kwargs)

    def observe(self, *args, **kwargs):
        self._counted()
        return super().observe(*args, **kwargs)


sys.exit(run_bench_with(Before))
