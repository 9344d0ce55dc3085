"""One B = 4 group of `trace_true_itl_b4.log` (order 1, group 5: dynamic 301.9 ms, static-1 245.7, static-0
308.9) decision by decision: (K, B, the rows' c_1 estimates, their first-draft steps, their
remaining tokens), after the prompts' m (drafts the target accepts from each position).

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/trace_group.py
"""
import numpy as np
import sim
from true_itl import PROFILE, SWEEP, TRUTH
ag, lens = SWEEP["agreement"], SWEEP["prompt_lens"]
B = 4
order = np.random.default_rng(101).permutation(len(ag))
dyn = sim.make_dynamic(PROFILE)
for gi, start in enumerate(range(0, 64, B)):
    g = order[start:start + B]
    log = []
    if gi == 5:
        orig = dyn.choose_k
        def ck(b, context_len=None, request_ids=None, remaining=None):
            k = orig(b, context_len, request_ids, remaining)
            rows = dyn._requests.rows_for(request_ids)
            est = dyn._requests.estimate(rows, 1)[:, 0]
            log.append((k, b, np.round(est, 2).tolist(), np.round(dyn._requests.reached[rows, 0], 1).tolist(), list(remaining)))
            return k
        dyn.choose_k = ck
    ms = sim.run_unit(dyn, [ag[j] for j in g], [lens[j] for j in g], list(range(start, start + B)), [64] * B, TRUTH)
    if gi == 5:
        dyn.choose_k = orig
        print("group 5 prompts", g.tolist(), "ms", round(ms, 1))
        for j in g:
            m = np.array(ag[j][:64])
            print(" prompt", j, "c1 (m>=1 share over 64 positions)", round(float((m >= 1).mean()), 2), "m[:40]", "".join(str(min(x, 9)) for x in m[:40]))
        for row in log[:30]:
            print(row)
        break
