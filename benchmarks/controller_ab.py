"""`dsd-jax bench` with a controller variant beside `dynamic`, in one process: an A/B of a
controller change, paired and interleaved like every configuration of the bench.

    from controller_ab import run_bench_with
    run_bench_with(Before)   # Before: a `Controller` subclass with the old rule
    run_bench_with(patched(undo))   # or: the controller, `undo(controller)` applied first
    run_bench_with_variant(make)    # or: make(runner, controller) returns the variant

The configuration `dynamic-throughput` is relabelled: the makespan controller (as `dynamic`)
built as `Before` (or by `make`), so `--configs vanilla,dynamic,dynamic-throughput` runs the change (dynamic)
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
    """`dsd-jax bench` with `dynamic-throughput` built as `before` (a `Controller` subclass)
    from the state of the controller `dynamic` would get."""
    def rebuild(runner, ctl):
        old = before.__new__(before)
        old.__dict__.update(ctl.__dict__)
        return old

    return run_bench_with_variant(rebuild, argv)


def run_bench_with_variant(make, argv=None) -> int:
    """`dsd-jax bench` with `dynamic-throughput` relabelled: the makespan controller the
    runner builds, passed through ``make(runner, controller)``, which returns the variant
    (e.g. one built from another `DynamicConfig`)."""
    DYNAMIC_OBJECTIVES["dynamic-throughput"] = "makespan"
    orig = R.Runner.controller

    def controller(self, config):
        ctl = orig(self, config)
        if config == "dynamic-throughput" and type(ctl) is C.Controller and not getattr(ctl, "_variant", False):
            ctl = make(self, ctl)
            ctl._variant = True
            self._dynamic[config] = ctl
        return ctl

    R.Runner.controller = controller
    from dsd_jax.cli import main
    return main(sys.argv[1:] if argv is None else argv)
