"""`dsd-jax bench` with a controller variant beside `dynamic`, in one process: an A/B of a
controller change, paired and interleaved like every configuration of the bench.

    from controller_ab import run_bench_with
    run_bench_with(Before)   # Before: a `Controller` subclass with the old rule
    run_bench_with(patched(undo))   # or: the controller, `undo(controller)` applied first

The configuration `dynamic-throughput` is relabelled: the makespan controller (as `dynamic`)
built as `Before`, so `--configs vanilla,dynamic,dynamic-throughput` runs the change (dynamic)
beside the rule before it. Used by the scripts beside their results in `benchmarks/results/`.
"""

from __future__ import annotations

import sys

from dsd_jax import controller as C
from dsd_jax.bench import runner as R
from dsd_jax.bench.settings import DYNAMIC_OBJECTIVES


def patched(undo) -> type:
    """A `Controller` subclass that calls `undo(self)` before its first choice, hold or
    observation (and before every later one: `undo` must be idempotent), for a change
    that lives in the controller's estimators rather than in a method to override."""

    class Before(C.Controller):
        def choose_k(self, *args, **kwargs):
            undo(self)
            return super().choose_k(*args, **kwargs)

        def held_k(self, *args, **kwargs):
            undo(self)
            return super().held_k(*args, **kwargs)

        def observe(self, *args, **kwargs):
            undo(self)
            return super().observe(*args, **kwargs)

    return Before


def run_bench_with(before: type, argv=None) -> int:
    DYNAMIC_OBJECTIVES["dynamic-throughput"] = "makespan"
    orig = R.Runner.controller

    def controller(self, config):
        ctl = orig(self, config)
        if config == "dynamic-throughput" and type(ctl) is C.Controller:
            old = before.__new__(before)
            old.__dict__.update(ctl.__dict__)
            self._dynamic[config] = old
            return old
        return ctl

    R.Runner.controller = controller
    from dsd_jax.cli import main
    return main(sys.argv[1:] if argv is None else argv)
