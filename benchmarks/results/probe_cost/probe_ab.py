"""A/B in one bench process: `dynamic` = cost-scaled acceptance probes (this change);
`dynamic-throughput` is relabelled: the makespan controller with probes every probe_interval (before)."""
import sys
import numpy as np
from dsd_jax import controller as C
from dsd_jax.bench import runner as R
from dsd_jax.bench.settings import DYNAMIC_OBJECTIVES

class Before(C.Controller):
    def _acceptance_probe(self, g_prior, itl):
        k, every = super()._acceptance_probe(g_prior, itl)
        return k, np.full_like(every, self._probe_interval)

DYNAMIC_OBJECTIVES["dynamic-throughput"] = "makespan"
orig = R.Runner.controller
def controller(self, config):
    ctl = orig(self, config)
    if config == "dynamic-throughput" and type(ctl) is C.Controller:
        old = Before.__new__(Before); old.__dict__.update(ctl.__dict__)
        self._dynamic[config] = old
        return old
    return ctl
R.Runner.controller = controller
from dsd_jax.cli import main
sys.exit(main(sys.argv[1:]))
