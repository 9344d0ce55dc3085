"""The engine's own step time per (batch bucket, K) in `generate`, for comparing with a
profile: each K run as a static controller over the prompts in groups of B, greedy, and
the median wall time of the steps at that batch size that follow no prefill.

    from generate_steps import static_step_ms
    table = static_step_ms(engine, prompts, buckets=[1, 2, 4, 8], ks=range(7))
"""
import statistics

import numpy as np

from dsd_jax.config import SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.sampling import SamplingParams


def static_step_ms(engine, prompts, buckets, ks, controller_cls=Controller, max_tokens=64) -> np.ndarray:
    """[bucket, K] median ms a step; `controller_cls` builds each K's static controller (a
    subclass can change how the engine dispatches it, e.g. `settled`)."""
    ks = list(ks)
    out = np.zeros((len(buckets), len(ks)))
    for bi, b in enumerate(buckets):
        for ki, k in enumerate(ks):
            spec = SpecConfig(method="draft_model", num_speculative_tokens=k) if k else SpecConfig(method="none")
            engine.controller = controller_cls(spec, None, engine.max_batch_size, batch_buckets=buckets)
            ms = []
            for g in range(0, len(prompts), b):
                engine.stats.reset()
                engine.generate(prompts[g:g + b], SamplingParams(temperature=0.0, max_tokens=max_tokens))
                ms += [t["wall_ms"] for t in engine.stats.trace if not t["after_prefill"] and t["batch_size"] == b]
            out[bi, ki] = statistics.median(ms)
    return out
