"""How long the device sits idle between steps because of the host loop.

    python benchmarks/host_overhead.py

Method: generate N tokens for one request (B = 1, K fixed) through the engine and take
its wall time W over the decode steps (prefill excluded: measured from the first step's
result). Then run the same compiled step program N times back to back with no host
work between calls (one block at the end): that is the device's own time D. The idle
fraction is 1 - D / W: the share of the engine's wall time the device waited on Python
(admission, controller, reading tokens back, bookkeeping).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models


class _Fixed:
    def __init__(self, k):
        self.k = k

    def choose_k(self, *a, **kw):
        return self.k

    def observe(self, *a, **kw):
        pass


def main(n_tokens: int = 400, repeats: int = 5):
    cfg = models.ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=16)
    target, draft = models.init_model(cfg, 0), models.init_model(cfg.replace(num_layers=1), 1)
    print(" K | engine ms/step | device ms/step | idle fraction")
    for k in (0, 2):
        engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=2), max_batch_size=1,
                            max_seq_len=n_tokens * 4 + 8, controller=_Fixed(k))
        engine.warmup()
        sp = SamplingParams(temperature=0.0, max_tokens=n_tokens)
        walls, devices = [], []
        for _ in range(repeats):
            engine.generate([[1, 2, 3]], sp)
            trace = engine.stats.trace[-engine.stats.steps:]
            steps = len(trace) - 1
            wall = sum(t["wall_ms"] for t in trace[1:]) / steps  # gaps between results
            step = engine.programs.step(k, 1)
            state = engine.state._replace(
                length=jnp.full_like(engine.state.length, 3), draft_len=jnp.full_like(engine.state.length, 2),
                limit=jnp.full_like(engine.state.length, 10**6), active=jnp.ones_like(engine.state.active))
            jax.block_until_ready(state)
            t0 = time.perf_counter()
            for _ in range(steps):
                state, out, _ = step(engine._target_params, engine._draft_params, state, np.int32(1))
            jax.block_until_ready(out)
            devices.append((time.perf_counter() - t0) / steps * 1e3)
            walls.append(wall)
            engine.state = state
            engine.stats.reset()
        w, d = np.median(walls), np.median(devices)
        print(f"{k:2d} | {w:14.3f} | {d:14.3f} | {max(0.0, 1 - d / w):.3f}")


if __name__ == "__main__":
    main()
