"""Replay at the bench's step times (`true_itl.py`): ROW_PRIOR_STEPS, the weight of the shrink
target in a row's own estimate, at 4 (shipped), 8 and 16.

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_prior_steps.py
"""
import dsd_jax.acceptance as A
import sim
from true_itl import PROFILE, STATIC, compare


def with_prior_steps(m):
    def make():
        A.ROW_PRIOR_STEPS = m  # read at every estimate: set before each run of its variant
        return sim.make_dynamic(PROFILE)
    return make


variants = {"static-0": STATIC["static-0"], "static-1": STATIC["static-1"],
            **{f"prior-{m}": with_prior_steps(m) for m in (4, 8, 16)}}
compare(variants, (1, 2, 4, 8, 16))
