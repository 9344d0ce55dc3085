"""Replay at the bench's step times (`true_itl.py`), B = 4: dynamic with the probes' catch-up priced at
zero, with a probe every 4th choice, and with margin 0.

    PYTHONPATH=benchmarks/results/replay:benchmarks/results/fresh_row_draft \\
        python benchmarks/results/fresh_row_draft/replay_k0_hold.py
"""
import sim
from true_itl import PROFILE, STATIC, compare

def no_catchup_price(ctl):
    ctl._latency.catchup_ms = lambda *a, **k: 0.0
    return ctl

def dynamic_with(**dynamic):
    """The makespan controller with other `DynamicConfig` fields."""
    def make():
        spec = sim.SpecConfig(method="draft_model", num_speculative_tokens=6,
                              dynamic=sim.DynamicConfig(objective="makespan", **dynamic))
        return sim.Controller(spec, PROFILE, 64, batch_buckets=sim.BUCKETS)
    return make

compare({"static-0": STATIC["static-0"], "static-1": STATIC["static-1"], "dynamic": lambda: sim.make_dynamic(PROFILE),
         "no-catchup-price": lambda: no_catchup_price(sim.make_dynamic(PROFILE)),
         "probe-4": dynamic_with(probe_interval=4), "margin-0": dynamic_with(margin=0.0)}, (4,))
