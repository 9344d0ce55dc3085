"""What this session's changes cost a step, in one process, interleaved and paired: the
drafter penalising its proposals, bad_words and allowed_token_ids.

Variants: "old" (`dsd_jax/step.py` and `drafters/draft_model.py` of ec10c28, paths given
as argv[1] and argv[2]: before either change), "new" (no row bans a word or penalises),
"banning" (every row has 8 bad-word sequences of 1-3 tokens), "restricted" (every row
allows 2048 of the 4096 ids), and "old penalised" /
"new penalised" (every row: repetition 1.1, presence 0.5, frequency 0.2; the new drafter
penalises its proposals too).

Built-in pair, 128 committed tokens a row, one `spec_step` per call, the state reset
between calls (untimed). Cells: B in {1, 16} x K in {0, 2} x temperature in {0, 1}.
Usage: git show ec10c28:dsd_jax/step.py > /tmp/old_step.py;
git show ec10c28:dsd_jax/drafters/draft_model.py > /tmp/old_draft_model.py;
python ab.py /tmp/old_step.py /tmp/old_draft_model.py [repeats] [cells, as B:K:T,B:K:T]"""
import dataclasses
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
from dsd_jax import bad_words
from dsd_jax import profiler as P
from dsd_jax import step as new_step
from dsd_jax.drafters import draft_model as new_dm
from dsd_jax.models.builtin import builtin


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


dsd.sampling.has_bias = dsd.sampling.any_listed  # the old step's name for it (renamed since)
old_step, old_dm = load("old_step", sys.argv[1]), load("old_draft_model", sys.argv[2])
REPEATS = int(sys.argv[3]) if len(sys.argv) > 3 else 40

target, draft, _ = builtin()
eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=16,
                     max_seq_len=256, batch_buckets=(1, 16))
progs = P._state_programs(eng)
state, eng.state = eng.state, None
graph, opts = eng.programs._graph, eng.programs.opts
new_drafter = eng.drafter
old_drafter = old_dm.DraftModel(**{f.name: getattr(new_drafter, f.name) for f in dataclasses.fields(new_drafter)})
tp, dp = eng._target_params, eng._draft_params


def stepper(module, drafter, K, B):
    def run(tp, dp, st):
        st, out = module.spec_step(graph, drafter, opts, K, B, tp, dp, st)
        # the old drafter builds its own state class: hand back the engine's, so every
        # variant's program takes and returns one pytree structure
        return st._replace(drafter=new_dm.DraftModelState(*st.drafter)), out.tokens
    return jax.jit(run, donate_argnums=2)


rng_words = np.random.default_rng(0)
SEQUENCES = [tuple(rng_words.integers(0, 4096, size=n).tolist()) for n in (1, 1, 2, 2, 2, 3, 3, 3)]


ALLOWED = dsd.sampling.allowed_array(range(0, 4096, 2))


@functools.partial(jax.jit, donate_argnums=0, static_argnums=(1, 2, 3))
def configure(st, penalise: bool, ban: bool, restrict: bool = False):
    r, p, f = (1.1, 0.5, 0.2) if penalise else (1.0, 0.0, 0.0)
    rows = bad_words.rows(SEQUENCES if ban else [])
    # the first 16 tokens of each row are its prompt, the rest its completion
    return st._replace(repetition_penalty=jnp.full_like(st.repetition_penalty, r),
                       presence_penalty=jnp.full_like(st.presence_penalty, p),
                       frequency_penalty=jnp.full_like(st.frequency_penalty, f),
                       prompt_length=jnp.full_like(st.prompt_length, 16),
                       bad_words=jnp.broadcast_to(jnp.asarray(rows), st.bad_words.shape),
                       allowed_ids=jnp.broadcast_to(jnp.asarray(ALLOWED if restrict else -np.ones_like(ALLOWED)),
                                                    st.allowed_ids.shape))


cells = [(B, K, t) for B in (1, 16) for K in (0, 2) for t in (0.0, 1.0)]
if len(sys.argv) > 4:  # some cells only, as B:K:T,B:K:T
    cells = [(int(b), int(k), float(t)) for b, k, t in (c.split(":") for c in sys.argv[4].split(","))]
# variant: (step module, drafter, penalise, ban[, restrict])
variants = {"old": (old_step, old_drafter, False, False), "new": (new_step, new_drafter, False, False),
            "banning": (new_step, new_drafter, False, True),
            "restricted": (new_step, new_drafter, False, False, True),
            "old penalised": (old_step, old_drafter, True, False),
            "new penalised": (new_step, new_drafter, True, False)}
fns = {(c, v): stepper(variants[v][0], variants[v][1], c[1], c[0]) for c in cells for v in variants}


def timed(cell, variant, st):
    B, K, t = cell
    st = progs.fill(st, jax.random.PRNGKey(0), eng.target_config.vocab_size, t)
    st = configure(st, *variants[variant][2:])
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
    print(f"B={B:2d} K={K} T={t:.0f}: old {ms['old']:6.2f} ms | new/old {ratio((cell, 'new'), (cell, 'old'))}  "
          f"banning/old {ratio((cell, 'banning'), (cell, 'old'))}  "
          f"restricted/old {ratio((cell, 'restricted'), (cell, 'old'))}  new pen./old pen. "
          f"{ratio((cell, 'new penalised'), (cell, 'old penalised'))}")
