"""A/B in one bench process: `dynamic` estimates acceptance from conditional rates
(`dsd_jax.acceptance` now), `dynamic-throughput` (relabelled by `controller_ab`: the same
makespan controller) from each position's own counts (`counted_acceptance.py`, frozen from
cb940b6).

    PYTHONPATH=benchmarks python benchmarks/results/conditional_rates/ab.py bench \\
        --configs vanilla,static-1,static-4,dynamic,dynamic-throughput ...
"""
import os
import sys

from controller_ab import patched, run_bench_with

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import counted_acceptance  # noqa: E402

from dsd_jax.controller import DEFAULT_FORGETTING  # noqa: E402


def counted(controller):
    """Swaps in the per-position estimators once (a no-op after)."""
    if not isinstance(controller._acc, counted_acceptance.GlobalAcceptance):
        dyn, profile = controller.spec.dynamic, controller.profile
        prior = counted_acceptance.padded_prior(None if profile is None else profile.acceptance,
                                                controller.max_k)
        controller._acc = counted_acceptance.GlobalAcceptance(
            prior, dyn.forgetting if dyn else DEFAULT_FORGETTING, dyn.warmup_steps if dyn else 0)
        controller._requests = counted_acceptance.RequestAcceptance(controller._acc)
        controller._est_tables = controller._acc.estimate.copy()
        controller._gtabs.clear()


sys.exit(run_bench_with(patched(counted)))
