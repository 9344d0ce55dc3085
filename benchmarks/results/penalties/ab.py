"""What the penalties cost a step, in one process, interleaved and paired: the step before
they existed ("old": `dsd_jax/step.py` of e4b85d0, a path given as argv[1]), the step now
with no row penalising ("new"), and the step now with every row penalising
("penalised": repetition 1.1, presence 0.5, frequency 0.2; for greedy rows this leaves
the all-greedy shortcut).

Built-in pair, 128 committed tokens a row, one `spec_step` per call, the state reset
between calls (untimed). Cells: B in {1, 16} x K in {0, 2} x temperature in {0, 1}.
Usage: git show e4b85d0:dsd_jax/step.py > /tmp/old_step.py; python ab.py /tmp/old_step.py [repeats]
[cells, as B:K:T,B:K:T]"""
import functools
import importlib.util
import random
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import dsd_jax as dsd
from dsd_jax import profiler as P
from dsd_jax import step as new_step
from dsd_jax.models.builtin import builtin

spec = importlib.util.spec_from_file_location("old_step", sys.argv[1])
old_step = sys.modules["old_step"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(old_step)
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 40

target, draft, _ = builtin()
eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=16,
                     max_seq_len=256, batch_buckets=(1, 16))
progs = P._state_programs(eng)
state, eng.state = eng.state, None
graph, drafter, opts = eng.programs._graph, eng.drafter, eng.programs.opts
tp, dp = eng._target_params, eng._draft_params


def stepper(module, K, B):
    def run(tp, dp, st):
        st, out = module.spec_step(graph, drafter, opts, K, B, tp, dp, st)
        return st, out.tokens
    return jax.jit(run, donate_argnums=2)


@functools.partial(jax.jit, donate_argnums=0, static_argnums=1)
def set_penalties(st, on: bool):
    r, p, f = (1.1, 0.5, 0.2) if on else (1.0, 0.0, 0.0)
    # the first 16 tokens of each row are its prompt, the rest its completion
    return st._replace(repetition_penalty=jnp.full_like(st.repetition_penalty, r),
                       presence_penalty=jnp.full_like(st.presence_penalty, p),
                       frequency_penalty=jnp.full_like(st.frequency_penalty, f),
                       prompt_length=jnp.full_like(st.prompt_length, 16))


cells = [(B, K, t) for B in (1, 16) for K in (0, 2) for t in (0.0, 1.0)]
if len(sys.argv) > 3:  # some cells only, as B:K:T,B:K:T
    cells = [(int(b), int(k), float(t)) for b, k, t in (c.split(":") for c in sys.argv[3].split(","))]
variants = {"old": (old_step, False), "new": (new_step, False), "penalised": (new_step, True)}
fns = {(c, v): stepper(variants[v][0], c[1], c[0]) for c in cells for v in variants}


def timed(cell, variant, st):
    B, K, t = cell
    st = progs.fill(st, jax.random.PRNGKey(0), eng.target_config.vocab_size, t)
    st = set_penalties(st, variants[variant][1])
    st = progs.reset(st, np.int32(B), np.int32(128), np.int32(0))
    jax.block_until_ready(st)
    t0 = time.perf_counter()
    st, out = fns[(cell, variant)](tp, dp, st)
    jax.block_until_ready((st, out))
    return st, time.perf_counter() - t0


for key in fns:  # compile and warm every program
    state, _ = timed(*key, state)
rng = random.Random(0)
times = {key: [] for key in fns}
for rep in range(REPEATS):
    for cell in cells:
        order = list(variants)
        rng.shuffle(order)
        for v in order:
            state, dt = timed(cell, v, state)
            times[(cell, v)].append(dt)
boot = np.random.default_rng(0)


def ratio(a, b):
    r = np.array(times[a]) / np.array(times[b])
    meds = [np.median(boot.choice(r, len(r))) for _ in range(2000)]
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return f"{np.median(r):.3f} [{lo:.3f}, {hi:.3f}]"


print(f"{REPEATS} pairs per cell; ratios are medians of paired ratios with 95% bootstrap intervals")
for cell in cells:
    B, K, t = cell
    ms = {v: 1e3 * statistics.median(times[(cell, v)]) for v in variants}
    print(f"B={B:2d} K={K} T={t:.0f}: old {ms['old']:6.2f} ms  new {ms['new']:6.2f} ms  penalised "
          f"{ms['penalised']:6.2f} ms | new/old {ratio((cell, 'new'), (cell, 'old'))}  "
          f"penalised/old {ratio((cell, 'penalised'), (cell, 'old'))}")
