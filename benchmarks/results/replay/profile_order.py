"""Is the profiler's K order a bias? Profile cells with the K order fixed (K=0 always right
after K=6, as `profile_engine` times them) and rotated every rep, three passes of each,
interleaved, against the engine's own step times in `generate` at each static K.

    python profile_order.py > profile_order.log     # about 5 minutes

Buckets 1-8, context 160, 7 reps of 4-round calls (`profile_engine`'s defaults).
"""
import statistics
import sys
from pathlib import Path

import jax
import numpy as np

from dsd_jax import models
from dsd_jax import profiler as P
from dsd_jax.bench.commands import _builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.loading import encode_prompts

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from generate_steps import static_step_ms  # noqa: E402

target, draft, tok = models.builtin()
BUCKETS = [1, 2, 4, 8]
eng = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=6), max_batch_size=8,
                 max_seq_len=448, tokenizer=tok, prefill_chunk=128, batch_buckets=BUCKETS)
eng.warmup()
ks = list(range(7))
def profile(rotate, ctx=160, reps=7, warm=2):
    programs = P._state_programs(eng)
    state = eng.state; eng.state = None
    state = programs.fill(state, jax.random.PRNGKey(0), eng.target_config.vocab_size, 0.0)
    table = np.zeros((len(BUCKETS), len(ks)))
    for bi, b in enumerate(BUCKETS):
        steps = [eng.programs.step(k, b) for k in ks]
        times = [[] for _ in ks]
        for rep in range(warm + reps):
            order = ks[rep % len(ks):] + ks[:rep % len(ks)] if rotate else ks
            for k in order:
                state, t = P._time_step(eng, programs, steps[k], state, b, ctx, 0, 4)
                if rep >= warm:
                    times[k].append(t)
        table[bi] = [statistics.median(t) * 1e3 for t in times]
    eng.state = programs.idle(state)
    return table
ids = [p[:128] for p in encode_prompts(_builtin_prompts(8), tok, target.config.vocab_size)]
fixed, rot, meas = [], [], []
for i in range(3):
    fixed.append(profile(False)); rot.append(profile(True)); meas.append(static_step_ms(eng, ids, BUCKETS, ks))
    print("pass", i, flush=True)
m = np.median(meas, axis=0)
np.set_printoptions(precision=2, suppress=True, linewidth=150)
print("measured ms\n", m)
for name, tabs in (("fixed order", fixed), ("rotated", rot)):
    tabs = np.array(tabs)
    print(name, "profiled / measured, median of 3 passes\n", np.median(tabs, 0) / m)
    print(name, "spread between passes (max/min - 1)\n", tabs.max(0) / tabs.min(0) - 1)
    r = tabs / tabs[:, :, :1]  # K/K0 ratios per pass
    print(name, "K/K0 profiled / K/K0 measured, each pass\n", r / (m / m[:, :1]))
