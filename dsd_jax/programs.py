"""Ahead-of-time compiled programs, one per (K, batch bucket) plus prefill/admit/move.

After `compile_all()` the engine only ever calls these executables, so switching K
or batch size compiles nothing (the analogue of per-K CUDA graphs).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dsd_jax import step as step_lib
from dsd_jax.state import MAX_STOP_IDS, DecodeState


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _i32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)


class Programs:
    def __init__(self, target_graph, drafter, opts: step_lib.StepOptions, target_params,
                 draft_params, state: DecodeState, batch_buckets, max_k: int, prefill_rows,
                 prefill_chunks):
        self.opts = opts
        self.batch_buckets = tuple(batch_buckets)
        self.max_k = max_k
        self.prefill_rows = tuple(prefill_rows)
        self.prefill_chunks = tuple(prefill_chunks)
        self._args = (_abstract(target_params), _abstract(draft_params), _abstract(state))
        self._step_fn = functools.partial(step_lib.spec_rounds, target_graph, drafter, opts)
        self._prefill = jax.jit(functools.partial(step_lib.prefill, target_graph, drafter, opts),
                                donate_argnums=2)
        self._admit = jax.jit(functools.partial(step_lib.admit, drafter), donate_argnums=0)
        self._move = jax.jit(step_lib.move_slot, donate_argnums=0)
        self._compiled: dict = {}

    def _get(self, key, lower):
        exe = self._compiled.get(key)
        if exe is None:
            exe = self._compiled[key] = lower().compile()
        return exe

    def step(self, k: int, b: int):
        """The (K, bucket) program: `(target_params, draft_params, state, num_rounds) ->
        (state, StepOutput [MAX_ROUNDS, ...], rounds run)` (see `step.spec_rounds`)."""
        if not 0 <= k <= self.max_k:
            raise ValueError(f"K={k} is outside the compiled range 0..{self.max_k}")
        if b not in self.batch_buckets:
            raise ValueError(f"batch bucket {b} is not one of {self.batch_buckets}")
        return self._get(("step", k, b), lambda: jax.jit(
            functools.partial(self._step_fn, k, b), donate_argnums=2).lower(*self._args, _i32()))

    def prefill(self, n: int, c: int):
        ints = _i32(n)
        return self._get(("prefill", n, c), lambda: self._prefill.lower(
            *self._args, ints, _i32(n, c), ints, ints, ints))

    def admit(self, n: int):
        f32 = jax.ShapeDtypeStruct((n,), jnp.float32)
        init = step_lib.SlotInit(_i32(n), _i32(n), _i32(n), f32, _i32(n), f32,
                                 jax.ShapeDtypeStruct((n,), jnp.uint32), _i32(n, MAX_STOP_IDS))
        return self._get(("admit", n), lambda: self._admit.lower(self._args[2], init))

    def move(self):
        return self._get(("move",), lambda: self._move.lower(self._args[2], _i32(), _i32()))

    def compile_all(self, progress=None) -> int:
        """Compiles every program; returns how many. `progress(done, total)` is optional."""
        jobs = [functools.partial(self.step, k, b) for b in self.batch_buckets
                for k in range(self.max_k + 1)]
        jobs += [functools.partial(self.prefill, n, c) for n in self.prefill_rows
                 for c in self.prefill_chunks]
        jobs += [functools.partial(self.admit, n) for n in self.prefill_rows] + [self.move]
        for i, job in enumerate(jobs):
            job()
            if progress:
                progress(i + 1, len(jobs))
        return len(jobs)
