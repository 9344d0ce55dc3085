"""Raw profiler samples for comparing cell estimators offline: six passes over buckets
1-8, each (bucket) row timed as `profile_engine` times it (2 warm-up + 7 reps, every K in
turn a rep), each K as calls of 4 and of 16 rounds back to back. Saves raw.npz:
times[pass, bucket, rep, K, R] in ms a round (warm-up reps dropped).

    python raw.py     # about 7 minutes
"""
import jax
import numpy as np

from dsd_jax import models
from dsd_jax import profiler as P
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine

target, draft, tok = models.builtin()
BUCKETS, ROUNDS, PASSES, REPS, WARM, CTX = [1, 2, 4, 8], [4, 16], 6, 7, 2, 160
eng = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=6), max_batch_size=8,
                 max_seq_len=448, tokenizer=tok, prefill_chunk=128, batch_buckets=BUCKETS)
eng.warmup()
ks = list(range(7))
times = np.zeros((PASSES, len(BUCKETS), REPS, len(ks), len(ROUNDS)))
programs = P._state_programs(eng)
state = eng.state; eng.state = None
state = programs.fill(state, jax.random.PRNGKey(0), eng.target_config.vocab_size, 0.0)
for p in range(PASSES):
    for bi, b in enumerate(BUCKETS):
        steps = [eng.programs.step(k, b) for k in ks]
        for rep in range(WARM + REPS):
            for k in ks:
                for ri, r in enumerate(ROUNDS):
                    state, t = P._time_step(eng, programs, steps[k], state, b, CTX, 0, r)
                    if rep >= WARM:
                        times[p, bi, rep - WARM, k, ri] = t * 1e3
    print("pass", p, flush=True)
np.savez("raw.npz", times=times, buckets=BUCKETS, rounds=ROUNDS)
