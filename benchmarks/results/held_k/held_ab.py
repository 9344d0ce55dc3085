"""A/B in one bench process: `dynamic` prefills the draft at admission when the controller
would hold K > 0 there (`Controller.held_k`, this change); `dynamic-throughput` is relabelled:
the same makespan controller, prefilling where the goodput row's bare argmax is K > 0 (before).

    python benchmarks/results/held_k/held_ab.py bench --configs vanilla,dynamic,dynamic-throughput ...
"""
import sys

import numpy as np

from dsd_jax import controller as C
from dsd_jax.bench import runner as R
from dsd_jax.bench.settings import DYNAMIC_OBJECTIVES


class Before(C.Controller):
    def held_k(self, batch_size, context_len=None):
        return int(np.argmax(self.predicted_goodput(batch_size, context_len)))


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
