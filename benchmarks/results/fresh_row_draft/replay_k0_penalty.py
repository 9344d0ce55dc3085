"""Replay at the bench's step times (`true_itl.py`): K = 0 priced x% below its goodput in every
decision (a wrong K = 0 hold is never corrected, a wrong K = 1 is: asymmetric costs).

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_k0_penalty.py
"""
import sim
from true_itl import PROFILE, STATIC, compare


def k0_penalty(x):
    def make():
        ctl = sim.make_dynamic(PROFILE)
        row = ctl._goodput_row

        def penalised(b, key, al):
            g = row(b, key, al)
            g[0] /= 1.0 + x
            return g

        ctl._goodput_row = penalised
        return ctl
    return make


compare({"static-0": STATIC["static-0"], "static-1": STATIC["static-1"], "dynamic": lambda: sim.make_dynamic(PROFILE),
         **{f"k0-{round(100 * x)}%": k0_penalty(x) for x in (0.03, 0.06, 0.10)}}, (1, 2, 4, 8, 16))
