"""A rough rule priced in the replay (not in the library): under the makespan objective,
where dynamic would hold K=0 while some live row has run fewer than ROW_PRIOR_STEPS drafts
of its own, run K=1 instead (its one draft is what decides c_1; K=0 would learn nothing).
`gated`: the same, only where the probes' price (the makespan row at the profile's
acceptance) would speculate.
`sequence.py`'s 8 orders of the 64 sweep prompts, K=0's time over each configuration's.

    PYTHONPATH=benchmarks/results/replay python benchmarks/results/b4_k0/replay_k1_while_fresh.py \\
        benchmarks/results/bench_full_s21.profile.json
"""
import json
import sys

import sequence
import sim
from dsd_jax.acceptance import ROW_PRIOR_STEPS
from dsd_jax.profile import Profile

sweep = json.load(open("benchmarks/results/replay/sweep.json"))
profile = Profile.load(sys.argv[1])


def k1_while_fresh(ctl, gated=False):
    """`gated`: only where the makespan row at the profile's acceptance (the acceptance
    probes' price) would speculate, beating K = 0 by more than the margin."""
    choose = ctl._choose_makespan

    def rule(batch_size, context_len, request_ids, remaining):
        k = choose(batch_size, context_len, request_ids, remaining)
        if k != 0 or not (ctl._requests.proposed[ctl._requests.rows_for(request_ids), 0] < ROW_PRIOR_STEPS).any():
            return k
        if gated:
            b, key, _, at = ctl._makespan_row(batch_size, context_len, request_ids, remaining)
            g = ctl._goodput_row(b, key, at(ctl._prior_a))
            if not g[1:].max() > g[0] * ctl._one_plus_margin:
                return k
        return 1

    ctl._choose_makespan = rule
    return ctl


variants = {"dynamic": lambda: sim.make_dynamic(profile), "k1-while-fresh": lambda: k1_while_fresh(sim.make_dynamic(profile)),
            "gated": lambda: k1_while_fresh(sim.make_dynamic(profile), gated=True),
            **{f"static-{k}": (lambda k=k: sim.static_controller(k)) for k in (0, 1, 2, 4)}}
for b in (1, 2, 4, 8, 16):
    print(sequence.summary(sweep, profile, b, 8, variants), flush=True)
