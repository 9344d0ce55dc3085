"""What SpecEngine(max_logprobs=N) costs a dispatch, in one process, interleaved and paired.

Variants: "old" (`dsd_jax/step.py` of 2d946c9, before top logprobs, its path given as
argv[1]), "N=0" (the step now, the default: no top-k, two zero-width outputs and one more
int per row in the packed array) and "N=20" (vLLM's default max_logprobs: a top-20 over
the vocabulary at every position, 40 more int32s per position read back). A call is what
the engine's dispatch does: one round of `spec_rounds`, `pack_rounds`, and the packed
array read back to the host. "floor": a jitted `jax.lax.top_k(logits, 20)` on the step's
logits shape [B, K+1, V] alone (random float32 logits, read back).

Built-in pair (vocabulary 4096), 128 committed tokens a row, temperature 1 (sampled rows:
the exact path), the state reset between calls (untimed). Cells: B in {1, 16} x K in {0, 2}.
Usage: git show 2d946c9:dsd_jax/step.py > /tmp/old_step.py; python ab.py /tmp/old_step.py [repeats]"""
import dataclasses
import importlib.util
import random
import statistics
import sys
import time

import jax
import numpy as np

import dsd_jax as dsd
from dsd_jax import profiler as P
from dsd_jax.stats import format_ratio, paired_ratio
from dsd_jax import step as new_step
from dsd_jax.models.builtin import builtin


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


old_step = load("old_step", sys.argv[1])
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
TOP = 20

target, draft, _ = builtin()
eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=16,
                     max_seq_len=256, batch_buckets=(1, 16))
V = eng.target_config.vocab_size
progs = P._state_programs(eng)
state, eng.state = eng.state, None
graph, drafter = eng.programs._graph, eng.drafter
tp, dp = eng._target_params, eng._draft_params
opts = eng.programs.opts
old_opts = old_step.StepOptions(acceptance=opts.acceptance, backend=opts.backend)


def dispatcher(module, opts, K, B):
    def run(tp, dp, st):
        st, outs, ran = module.spec_rounds(graph, drafter, opts, K, B, tp, dp, st, 1)
        return st, module.pack_rounds(outs, ran)
    return jax.jit(run, donate_argnums=2)


def floor(K, B):
    top = jax.jit(lambda x: jax.lax.top_k(x, TOP))
    logits = jax.random.normal(jax.random.PRNGKey(0), (B, K + 1, V))
    return lambda: jax.device_get(top(logits))


cells = [(B, K) for B in (1, 16) for K in (0, 2)]
variants = {"old": (old_step, old_opts), "N=0": (new_step, dataclasses.replace(opts, top_logprobs=0)),
            f"N={TOP}": (new_step, dataclasses.replace(opts, top_logprobs=TOP))}
fns = {(c, v): dispatcher(*variants[v], c[1], c[0]) for c in cells for v in variants}
floors = {c: floor(c[1], c[0]) for c in cells}


def timed(cell, variant, st):
    B, K = cell
    st = progs.fill(st, jax.random.PRNGKey(0), V, 1.0)
    st = progs.reset(st, np.int32(B), np.int32(128), np.int32(0))
    jax.block_until_ready(st)
    t0 = time.perf_counter()
    st, packed = fns[(cell, variant)](tp, dp, st)
    np.asarray(packed)  # the host's read, as the engine's `_process`
    return st, time.perf_counter() - t0


def timed_floor(cell):
    t0 = time.perf_counter()
    floors[cell]()
    return time.perf_counter() - t0


for key in fns:  # compile and warm every program
    state, _ = timed(*key, state)
for cell in cells:
    timed_floor(cell)
rng = random.Random(0)
times = {key: [] for key in fns}
floor_times = {c: [] for c in cells}
for rep in range(REPEATS):
    for cell in cells:
        order = list(variants) + ["floor"]
        rng.shuffle(order)
        for v in order:
            if v == "floor":
                floor_times[cell].append(timed_floor(cell))
            else:
                state, dt = timed(cell, v, state)
                times[(cell, v)].append(dt)
def ratio(a, b):
    return format_ratio(paired_ratio(times[a], times[b]), digits=3)


print(f"V={V}, {REPEATS} pairs per cell; ratios: dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
for cell in cells:
    B, K = cell
    ms = {v: 1e3 * statistics.median(times[(cell, v)]) for v in variants}
    extra = ms[f"N={TOP}"] - ms["N=0"]
    print(f"B={B:2d} K={K}: old {ms['old']:6.3f} ms | N=0/old {ratio((cell, 'N=0'), (cell, 'old'))}  "
          f"N={TOP}/N=0 {ratio((cell, f'N={TOP}'), (cell, 'N=0'))}  (+{extra:.3f} ms; bare top-{TOP} "
          f"{1e3 * statistics.median(floor_times[cell]):.3f} ms)")
