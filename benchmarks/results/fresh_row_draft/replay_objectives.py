"""Replay at the bench's step times (`true_itl.py`): the makespan objective against its
slowest-row mean alone (no spread: z = 0) and the throughput objective.

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_objectives.py
"""
import sim
from true_itl import PROFILE, STATIC, compare


def no_spread(ctl):
    rq = ctl._requests
    steps = rq.makespan_steps
    rq.makespan_steps = lambda rows, rem, k, batch_size, acceptance=None: steps(rows, rem, k, 1, acceptance=acceptance)
    return ctl


def throughput():
    spec = sim.SpecConfig(method="draft_model", num_speculative_tokens=6,
                          dynamic=sim.DynamicConfig(objective="throughput"))
    return sim.Controller(spec, PROFILE, 64, batch_buckets=sim.BUCKETS)


compare({"static-0": STATIC["static-0"], "static-1": STATIC["static-1"], "dynamic": lambda: sim.make_dynamic(PROFILE),
         "no-spread": lambda: no_spread(sim.make_dynamic(PROFILE)), "throughput": throughput}, (1, 2, 4, 8, 16))
