"""Where a plain-decoding step's time goes against the floor, per step, one process (B=1, S=4096).

    python step_parts.py REPS

Per step / round, medians (ms):
  floor         `side_by_side.make_floor` (cache sized to the request: 64 + 128 positions)
  floor_cap     the same loop over a cache of the engine's capacity (4097), passed in donated
  engine_bare   the floor's loop body (forward, argmax) run as the engine's K=0 step program,
                on the engine's state (`step.spec_rounds` replaced)
  engine        the engine's K=0 step program
Floor rows: (98 tokens - 2 tokens) / 96. Engine rows: a 32-round dispatch / 32, timed alone
after admitting one prompt (dispatch overhead included, ~0.8 ms / 32).
"""
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paired import plain_engine
from dsd_jax import models, step as S
from dsd_jax.bench.side_by_side import builtin_prompts, make_floor
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams

REPS = int(sys.argv[1])
target, draft, tok = models.builtin()
prompts = [p[:64] for p in builtin_prompts(4, 0, tok)[0]]
graphdef, params = nnx.split(target)
floor = make_floor(target, 64)


def floor_over_cache(capacity: int):
    """make_floor's loop, its cache (of `capacity`) passed in and donated, as the engine's is."""
    @functools.partial(jax.jit, static_argnums=(3,), donate_argnums=(4,))
    def decode(params, tokens, lengths, max_tokens, kv):
        B, P = tokens.shape
        cols = jnp.arange(P, dtype=jnp.int32)[None]
        logits, kv = models.forward(graphdef, params, tokens, jnp.where(cols < lengths[:, None], cols, -1), kv)
        first = jnp.argmax(logits[jnp.arange(B), lengths - 1], axis=-1).astype(jnp.int32)
        out = jnp.zeros((B, max_tokens), jnp.int32).at[:, 0].set(first)

        def step(t, carry):
            kv, tok, out = carry
            logits, kv = models.forward(graphdef, params, tok[:, None], (lengths + t - 1)[:, None], kv)
            tok = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
            return kv, tok, out.at[:, t].set(tok)

        kv, _, out = jax.lax.fori_loop(1, max_tokens, step, (kv, first, out))
        return out, kv

    cache = {"kv": models.init_kv_cache(target.config, 1, capacity)}

    def run(prompt, n):
        tokens = np.zeros((1, 64), np.int32)
        tokens[0, :len(prompt)] = prompt
        out, cache["kv"] = decode(params, tokens, np.array([len(prompt)], np.int32), n, cache["kv"])
        return np.asarray(out)

    return run


def bare_rounds(target_graph, drafter, opts, K, B, tp, dp, state, num_rounds, any_active=jnp.any):
    """The floor's loop body in place of `spec_rounds` (outputs: tokens only)."""
    R = S.MAX_ROUNDS

    def body(i, carry):
        kv, tok, out, length = carry
        logits, kv = models.forward(target_graph, tp, tok[:, None], (length - 1)[:, None], kv)
        tok = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        return kv, tok, out.at[i].set(tok), length + 1

    length = state.length[:B]
    tok0 = S.gather_tokens(state.tokens[:B], length[:, None] - 1)[:, 0]
    kv, tok, out, length = jax.lax.fori_loop(0, num_rounds, body, (state.target_kv, tok0,
                                                                  jnp.zeros((R, B), jnp.int32), length))
    state = state._replace(target_kv=kv, length=state.length.at[:B].set(length))
    z = jnp.zeros((R, B), jnp.int32)
    return state, S.StepOutput(out[..., None], jnp.ones((R, B), jnp.int32), z, z.astype(bool),
                               jnp.zeros((R, B, 1)), jnp.zeros((R, B, 1)), jnp.zeros((R, B, 1, 0)),
                               jnp.zeros((R, B, 1, 0), jnp.int32)), num_rounds


engines = {}
for name, fn in {"engine": S.spec_rounds, "engine_bare": bare_rounds}.items():
    saved, S.spec_rounds = S.spec_rounds, fn
    engines[name] = plain_engine(SpecEngine, target, tok, 4096)
    S.spec_rounds = saved
sp = SamplingParams(temperature=0.0, max_tokens=128)


def per_round(e, prompt) -> float:
    reqs = e._make_requests([prompt], sp)
    shards = [[]]
    e._place(reqs, shards)
    e._admit(reqs, shards, refilled=False)
    jax.block_until_ready(e.state)
    step = e.programs.step(0, 1)
    e.state, out = step(e._target_params, e._draft_params, e.state, np.int32(1))
    jax.device_get(out)
    t = time.perf_counter()
    e.state, out = step(e._target_params, e._draft_params, e.state, np.int32(32))
    jax.device_get(out)
    dt = (time.perf_counter() - t) / 32
    e.state = e._freed_state()
    return dt


def floor_step(run, prompt) -> float:
    t = time.perf_counter()
    run(prompt, 2)
    short = time.perf_counter() - t
    t = time.perf_counter()
    run(prompt, 98)
    return (time.perf_counter() - t - short) / 96


floors = {"floor": lambda p, n: floor([p], n), "floor_cap": floor_over_cache(4097)}
res = {k: [] for k in list(floors) + list(engines)}
for rep in range(REPS + 1):  # the first pass warms up
    for p in prompts:
        for name, run in floors.items():
            x = floor_step(run, p)
            if rep:
                res[name].append(x)
        for name, e in engines.items():
            x = per_round(e, p)
            if rep:
                res[name].append(x)
print({k: round(float(np.median(v)) * 1e3, 4) for k, v in res.items()},
      f"({REPS * len(prompts)} samples each)")
