"""Replay at the bench's step times (`true_itl.py`): dynamic priced by the profile (as shipped)
against dynamic priced by the true step times from its first step (the profile it would have
had, had the profiling runs measured what the bench's runs did).

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_oracle_itl.py
"""
import sim
from true_itl import PROFILE, STATIC, TRUTH, compare

compare({**STATIC, "dynamic": lambda: sim.make_dynamic(PROFILE), "dynamic-true-itl": lambda: sim.make_dynamic(TRUTH)},
        (1, 2, 4, 8, 16))
