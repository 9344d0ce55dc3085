"""A/B in one bench process: `dynamic` spaces acceptance probes charging the draft's
catch-up (the profile's `catchup_ms`, this change); `dynamic-throughput` is relabelled: the
same makespan controller spacing them by the step cost alone (before).

    python benchmarks/results/probe_catchup/catchup_ab.py bench --configs vanilla,dynamic,dynamic-throughput ...
"""
import sys

from dsd_jax import controller as C
from dsd_jax.bench import runner as R
from dsd_jax.bench.settings import DYNAMIC_OBJECTIVES


class Before(C.Controller):
    def _acceptance_probe(self, g_prior, itl, catchup_ms=None):
        return super()._acceptance_probe(g_prior, itl, None)


DYNAMIC_OBJECTIVES["dynamic-throughput"] = "makespan"
orig = R.Runner.controller


def controller(self, config):
    ctl = orig(self, config)
    if config == "dynamic-throughput" and type(ctl) is C.Controller:
        old = Before.__new__(Before)
        old.__dict__.update(ctl.__dict__)
        self._dynamic[config] = old
        return old
    return ctl


R.Runner.controller = controller
from dsd_jax.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
