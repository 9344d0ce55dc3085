"""Does the profiler's per-round price depend on the rounds in its timed call? The
profile's cells, timed as calls of R rounds each with a sync (R = 1, 4, 16), and the
slope between R = 4 and 16 (a round's device time, no per-call overhead), against the
engine's own step times in `generate` at each static K: settled (32 rounds a dispatch,
as static K and dynamic's K = 0 holds run) and unsettled (8 rounds a dispatch, as
dynamic's K > 0 runs). Three passes, interleaved; medians.

    python rounds.py > rounds.log     # about 10 minutes

Buckets 1-8, context 160, 7 reps (`profile_engine`'s defaults).
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
from dsd_jax.controller import Controller
from dsd_jax.engine import SpecEngine
from dsd_jax.loading import encode_prompts

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from generate_steps import static_step_ms  # noqa: E402

target, draft, tok = models.builtin()
BUCKETS = [1, 2, 4, 8]
ROUNDS = [1, 4, 16]
eng = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=6), max_batch_size=8,
                 max_seq_len=448, tokenizer=tok, prefill_chunk=128, batch_buckets=BUCKETS)
eng.warmup()
ks = list(range(7))


def profile(ctx=160, reps=7, warm=2):
    """{R: table[bucket, K]} in ms a round, every R timed in turn for each (K, rep)."""
    programs = P._state_programs(eng)
    state = eng.state; eng.state = None
    state = programs.fill(state, jax.random.PRNGKey(0), eng.target_config.vocab_size, 0.0)
    tables = {r: np.zeros((len(BUCKETS), len(ks))) for r in ROUNDS}
    for bi, b in enumerate(BUCKETS):
        steps = [eng.programs.step(k, b) for k in ks]
        times = {r: [[] for _ in ks] for r in ROUNDS}
        for rep in range(warm + reps):
            for k in ks:
                for r in ROUNDS:
                    state, t = P._time_step(eng, programs, steps[k], state, b, ctx, 0, r)
                    if rep >= warm:
                        times[r][k].append(t)
        for r in ROUNDS:
            tables[r][bi] = [statistics.median(t) * 1e3 for t in times[r]]
    eng.state = programs.idle(state)
    return tables


class Unsettled(Controller):
    """A static controller the engine treats as a goodput one: 8 rounds a dispatch."""
    def settled(self, *a, **kw):
        return False


ids = [p[:128] for p in encode_prompts(_builtin_prompts(8), tok, target.config.vocab_size)]


prof, m32, m8 = [], [], []
for i in range(3):
    prof.append(profile())
    m32.append(static_step_ms(eng, ids, BUCKETS, ks))
    m8.append(static_step_ms(eng, ids, BUCKETS, ks, Unsettled))
    print("pass", i, flush=True)
np.set_printoptions(precision=2, suppress=True, linewidth=150)
m32, m8 = np.median(m32, axis=0), np.median(m8, axis=0)
print("measured ms a step, 32-round dispatches (static K)\n", m32)
print("measured ms a step, 8-round dispatches (dynamic's K > 0)\n", m8)
tabs = {r: np.array([p[r] for p in prof]) for r in ROUNDS}
tabs["slope 4-16"] = (tabs[16] * 16 - tabs[4] * 4) / 12
for name, t in tabs.items():
    med = np.median(t, 0)
    print(f"--- R = {name}: ms a round, median of passes\n", med)
    print(f"R = {name}: profiled / measured(32)\n", med / m32)
    print(f"R = {name}: K/K0 profiled / K/K0 measured(32)\n", (med / med[:, :1]) / (m32 / m32[:, :1]))
    print(f"R = {name}: K/K0 profiled / K/K0 measured(8 for K>0, 32 for K=0)\n",
          (med / med[:, :1]) / (m8 / m32[:, :1]))
    print(f"R = {name}: spread between passes (max/min - 1)\n", t.max(0) / t.min(0) - 1)
