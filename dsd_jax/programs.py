"""Ahead-of-time compiled programs, one per (K, batch bucket) plus prefill/admit/move.

After `compile_all()` the engine only ever calls these executables, so switching K
or batch size compiles nothing (the analogue of per-K CUDA graphs).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

from dsd_jax import step as step_lib
from dsd_jax.sharding import Placement
from dsd_jax.state import MAX_STOP_IDS, DecodeState


class Programs:
    def __init__(self, target_graph, drafter, opts: step_lib.StepOptions, target_params,
                 draft_params, state: DecodeState, batch_buckets, max_k: int, prefill_rows,
                 prefill_chunks, placement: Placement | None = None):
        self.opts = opts
        self.batch_buckets = tuple(batch_buckets)
        self.max_k = max_k
        self.prefill_rows = tuple(prefill_rows)
        self.prefill_chunks = tuple(prefill_chunks)
        place = self.placement = placement or Placement(None, 0, None)
        state_sh = place.state_shardings(state)
        # explicit shardings on a mesh: every argument's layout is fixed at compile time, and
        # the state comes back in the layout it went in (it is donated and fed back)
        self._args = (place.abstract(target_params, place.param_shardings(target_params, "target")),
                      place.abstract(draft_params, place.param_shardings(draft_params, "draft")),
                      place.abstract(state, state_sh))
        rep = place.replicated
        outs = {} if state_sh is None else {"out_shardings": state_sh}
        self._step_outs = {} if state_sh is None else {"out_shardings": (state_sh, rep, rep)}
        self._step_fn = functools.partial(step_lib.spec_rounds, target_graph, drafter, opts)
        self._prefill = jax.jit(functools.partial(step_lib.prefill, target_graph, drafter, opts),
                                donate_argnums=2, **outs)
        self._admit = jax.jit(functools.partial(step_lib.admit, drafter), donate_argnums=0, **outs)
        self._move = jax.jit(step_lib.move_slot, donate_argnums=0, **outs)
        self._compiled: dict = {}

    def _get(self, key, lower):
        exe = self._compiled.get(key)
        if exe is None:
            # traced under the engine's mesh, so the Pallas kernels run per device (`kernels`)
            mesh = self.placement.mesh
            with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
                lowered = lower()
            exe = self._compiled[key] = lowered.compile()
        return exe

    def step(self, k: int, b: int):
        """The (K, bucket) program: `(target_params, draft_params, state, num_rounds) ->
        (state, StepOutput [MAX_ROUNDS, ...], rounds run)` (see `step.spec_rounds`)."""
        if not 0 <= k <= self.max_k:
            raise ValueError(f"K={k} is outside the compiled range 0..{self.max_k}")
        if b not in self.batch_buckets:
            raise ValueError(f"batch bucket {b} is not one of {self.batch_buckets}")
        return self._get(("step", k, b), lambda: jax.jit(
            functools.partial(self._step_fn, k, b), donate_argnums=2, **self._step_outs).lower(
                *self._args, self._i32()))

    def _host(self, shape, dtype=jnp.int32):
        """A small host-side argument (replicated on a mesh)."""
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self.placement.replicated)

    def _i32(self, *shape):
        return self._host(shape)

    def prefill(self, n: int, c: int):
        ints = self._i32(n)
        return self._get(("prefill", n, c), lambda: self._prefill.lower(
            *self._args, ints, self._i32(n, c), ints, ints, ints))

    def admit(self, n: int):
        f32, i32 = self._host((n,), jnp.float32), self._i32(n)
        init = step_lib.SlotInit(i32, i32, i32, f32, i32, f32, self._host((n,), jnp.uint32),
                                 self._i32(n, MAX_STOP_IDS))
        return self._get(("admit", n), lambda: self._admit.lower(self._args[2], init))

    def move(self):
        return self._get(("move",), lambda: self._move.lower(self._args[2], self._i32(), self._i32()))

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
