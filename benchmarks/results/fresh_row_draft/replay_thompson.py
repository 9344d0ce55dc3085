"""Replay at the bench's step times (`true_itl.py`): dynamic against dynamic whose rows'
first-draft rates are drawn from their Beta posteriors at every decision (Thompson).

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_thompson.py 1 2 4 8 16
"""
import sys

import numpy as np

import sim
from dsd_jax.acceptance import ROW_PRIOR_STEPS
from true_itl import PROFILE, STATIC, compare


def thompson(ctl, seed=0):
    rq = ctl._requests
    rng = np.random.default_rng(seed)
    estimate = rq.estimate

    def drawn(rows, k):
        a = estimate(rows, k)  # also refreshes rq._prior_counts
        rows = np.asarray(rows)
        alpha = rq.accepted[rows, 0] + rq._prior_counts[0]
        n = rq.reached[rows, 0] + ROW_PRIOR_STEPS
        c1 = rng.beta(np.maximum(alpha, 1e-3), np.maximum(n - alpha, 1e-3))
        return np.minimum(a * (c1 / np.maximum(alpha / n, 1e-9))[:, None], 1.0)

    rq.estimate = drawn
    return ctl


compare({**STATIC, "dynamic": lambda: sim.make_dynamic(PROFILE), "thompson": lambda: thompson(sim.make_dynamic(PROFILE))},
        [int(x) for x in sys.argv[1:]] or (1, 2, 4, 8, 16))
