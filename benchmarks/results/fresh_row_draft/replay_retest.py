"""Replay at the bench's step times (`true_itl.py`): a held K = 0 re-tested by a K = 1 step
while some live row has run fewer than N first drafts of its own, gated by the makespan row
at the profile's acceptance (the reverted rule, `fresh_row_rule.patch`, is N = 4).

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_retest.py
"""
import sim
from true_itl import PROFILE, STATIC, compare


def retest_below(n):
    def make():
        ctl = sim.make_dynamic(PROFILE)
        choose = ctl._choose_makespan

        def rule(batch_size, context_len, request_ids, remaining):
            k = choose(batch_size, context_len, request_ids, remaining)
            rows = ctl._requests.rows_for(request_ids)
            if k != 0 or not (ctl._requests.proposed[rows, 0] < n).any():
                return k
            b, key, _, at = ctl._makespan_row(batch_size, context_len, request_ids, remaining)
            g = ctl._goodput_row(b, key, at(ctl._prior_a))
            return 1 if g[1:].max() > g[0] * ctl._one_plus_margin else 0

        ctl._choose_makespan = rule
        return ctl
    return make


compare({"static-0": STATIC["static-0"], "static-1": STATIC["static-1"], "dynamic": lambda: sim.make_dynamic(PROFILE),
         **{f"retest-{n}": retest_below(n) for n in (4, 8, 16)}}, (1, 2, 4, 8, 16))
