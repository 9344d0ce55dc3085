"""Ahead-of-time compiled programs, one per (K, batch bucket) plus prefill/admit/move.

After `compile_all()` the engine only ever calls these executables, so switching K
or batch size compiles nothing (the analogue of per-K CUDA graphs). Every program runs
once per "data" shard on that shard's slots (`dsd_jax.data_parallel`): host arguments
carry a leading [data] axis (1 without data parallelism), batch buckets and slot
indices are per shard, and a step's outputs are [rounds, data * bucket, ...].
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
import warnings
from typing import Callable

import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec as P

from dsd_jax import kernels, shared_programs
from dsd_jax import step as step_lib
from dsd_jax.bad_words import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS
from dsd_jax.buckets import move_buckets
from dsd_jax.data_parallel import HOST, PARAMS, STATE, any_active, per_shard, summed_counters
from dsd_jax.map_budget import MapBudget
from dsd_jax.sharding import DATA, Placement
from dsd_jax.sampling import MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS
from dsd_jax.state import MAX_STOP_IDS, DecodeState


class _Waited:
    """A compiled program whose every call waits for its outputs. On XLA:CPU with more than
    one device, collective programs dispatched one after another without waiting can leave
    the devices' threads stuck at a rendezvous for good: a plain jitted all-reduce over 4
    fake CPU devices hangs after one unwaited call on 2 cores, and 3000 waited ones run
    (`benchmarks/results/mesh_hang/`, docs/design.md section 11). Everything else of the
    compiled program (`as_text`, `memory_analysis`, ...) is its own."""

    def __init__(self, exe):
        self._exe = exe

    def __call__(self, *args):
        return jax.block_until_ready(self._exe(*args))

    def __getattr__(self, name):
        return getattr(self._exe, name)


class Programs:
    def __init__(self, target_graph, drafter, opts: step_lib.StepOptions, target_params,
                 draft_params, state: DecodeState, batch_buckets, max_k: int, prefill_rows,
                 prefill_chunks, placement: Placement | None = None, fallback: bool = False,
                 matmul_precision: str | None = None):
        """`fallback`: a program that fails to lower or compile with a Pallas kernel in it
        switches that kernel to its XLA path, with a `kernels.PallasFallbackWarning` (the
        engine sets it for backend="auto" on GPU/TPU). `matmul_precision`: every program is
        traced under it (a `jax.default_matmul_precision` value; None: the platform's default),
        whatever the context of the call that first needs it (a thread, say)."""
        self.matmul_precision = matmul_precision
        # host seconds spent tracing, lowering and compiling programs (warm-up, or a run's
        # first use of one): a run's step times that span a compile are not its speed
        self.compile_s = 0.0
        self._maps = None  # set below, on a CPU: XLA:CPU's kernels count against the map limit
        self.batch_buckets = tuple(batch_buckets)
        self.max_k = max_k
        self.prefill_rows = tuple(prefill_rows)
        self.prefill_chunks = tuple(prefill_chunks)
        place = self.placement = placement or Placement(None, (0, 0), None)
        self.data = data = place.sizes[DATA]
        # XLA:CPU meshes: every program call waits for its outputs (`_Waited`)
        self.waits_each_call = place.mesh is not None and place.mesh.size > 1 and place.device.platform == "cpu"
        state_sh = place.state_shardings(state)
        slot_bytes = sum(math.prod(x.shape[1:]) * x.dtype.itemsize for x in jax.tree.leaves(step_lib.per_slot(state)))
        self.move_rows = move_buckets(state.length.shape[0] // data, slot_bytes)
        # explicit shardings on a mesh: every argument's layout is fixed at compile time, and
        # the state comes back in the layout it went in (it is donated and fed back)
        self._args = (place.abstract(target_params, place.param_shardings(target_params, "target")),
                      place.abstract(draft_params, place.param_shardings(draft_params, "draft")),
                      place.abstract(state, state_sh))
        rep = place.replicated
        outs = {} if state_sh is None else {"out_shardings": state_sh}
        # outputs replicated: every process of a multi-host run reads them whole
        self._step_outs = {} if state_sh is None else {"out_shardings": (state_sh, rep)}
        local = self._step_shards_specs = place.data_specs(state) if data > 1 else None

        def shards(fn, kinds, out_specs=local):
            return per_shard(fn, place.mesh, data, local, kinds, out_specs)

        self._shards, self._outs, self._state_sh = shards, outs, state_sh
        self._graph = target_graph
        if place.device.platform == "cpu":
            self._maps = MapBudget()
        self._fallback = fallback
        # called with the new backends after a fallback (the engine re-checks its profile's kernels)
        self.on_fallback: Callable[[kernels.KernelBackends], None] | None = None
        self._build(opts, drafter)

    def _build(self, opts: step_lib.StepOptions, drafter) -> None:
        """The jitted programs for these step options and drafter (nothing compiled yet)."""
        shards, outs, local = self._shards, self._outs, self._step_shards_specs
        self.opts, self._drafter = opts, drafter
        self._step_shards = functools.partial(shards, kinds=(PARAMS, PARAMS, STATE, PARAMS),
                                              out_specs=(local, P(None, DATA)))
        prefill = functools.partial(step_lib.prefill, self._graph, drafter, opts)
        self._prefill = jax.jit(shards(prefill, (PARAMS, PARAMS, STATE) + (HOST,) * 6),
                                donate_argnums=2, **outs)
        # the same with next_tokens: it also returns the prompt logprobs, batch axis on "data"
        self._prefill_scored = jax.jit(shards(prefill, (PARAMS, PARAMS, STATE) + (HOST,) * 7,
                                              out_specs=(local, P(DATA))),
                                       donate_argnums=2, **self._step_outs)
        self._admit = jax.jit(shards(functools.partial(step_lib.admit, drafter), (STATE, HOST)),
                              donate_argnums=0, **outs)
        # swaps of slots: a program reads the destinations' rows, then one moves (`move_slots`)
        rows_specs = None if local is None else step_lib.per_slot(local)
        rows_outs = {} if self._state_sh is None else {"out_shardings": step_lib.per_slot(self._state_sh)}
        self._rows = jax.jit(shards(step_lib.slot_rows, (STATE, HOST), out_specs=rows_specs), **rows_outs)
        self._move = jax.jit(shards(step_lib.move_slots, (STATE, HOST, HOST, rows_specs)), donate_argnums=0, **outs)
        self._copy = jax.jit(shards(step_lib.copy_slots, (STATE, HOST, HOST)), donate_argnums=0, **outs)
        self._compiled: dict = {}
        self._share_key = self._structure_key()

    def _structure_key(self):
        """What every program of these depends on besides its own key (`shared_programs`):
        None where the drafter's programs are not shared."""
        drafter_key = self._drafter.program_key()
        if drafter_key is None:
            return None
        place = self.placement
        key = (self._graph, drafter_key, self.opts, kernels.resolve_backends(self.opts.backend),
               jax.tree.structure(self._args), tuple(jax.tree.leaves(self._args)), place.mesh,
               place.device, self.batch_buckets, self.max_k, self.prefill_rows, self.prefill_chunks,
               self.move_rows, self.matmul_precision)
        try:
            hash(key)
        except TypeError:  # (a field of a user's drafter, say)
            return None
        return key

    @property
    def drafter(self):
        return self._drafter

    @property
    def kernel_backends(self) -> dict[str, str]:
        """Each kernel's backend in these programs, e.g. {"attention": "pallas", ...}."""
        return kernels.resolve_backends(self.opts.backend)._asdict()

    def is_compiled(self, *key) -> bool:
        """Whether a program is compiled, e.g. `is_compiled("step", k, b)` (the method's
        name and arguments)."""
        return tuple(key) in self._compiled

    @contextlib.contextmanager
    def _tracing(self):
        """Where every program is traced: under the engine's mesh, so the Pallas kernels run
        per device (`kernels`), without one under no mesh at all, not a caller's
        `jax.set_mesh` around the call; in 32 bits whatever a caller's jax_enable_x64 (the
        programs are int32 throughout); and at the engine's matmul precision, not the
        calling thread's."""
        with (jax.set_mesh(self.placement.mesh), jax.enable_x64(False),
              jax.default_matmul_precision(self.matmul_precision)):
            yield

    def scratch_bytes(self) -> int | None:
        """The most scratch (XLA's temp buffers) one compiled program needs per device, beyond
        its arguments and outputs: a step's logits, probabilities and noise over [B, K+1, V]
        (1.5 GiB at B=64, K=4, V=128256). None before anything is compiled."""
        temps = [exe.memory_analysis().temp_size_in_bytes for exe in self._compiled.values()]
        return max(temps) if temps else None

    def _get(self, key, lower):
        exe = self._compiled.get(key)
        if exe is None:
            exe = self._shared(key)
        if exe is None:
            # (a MapLimitError is raised here, not taken below for a kernel's failure)
            maps_before = None if self._maps is None else self._maps.check([key], f"program {key}")
            start = time.perf_counter()
            try:
                with self._tracing():
                    lowered = lower()
                exe = lowered.compile()
            except Exception as err:  # noqa: BLE001  (Triton/Mosaic raise many kinds)
                self.compile_s += time.perf_counter() - start  # (the fallback's compiles count their own)
                if not self._fallback:
                    raise
                self._fall_back(key, err)
                return self._compiled[key]
            self.compile_s += time.perf_counter() - start
            if maps_before is not None:
                self._maps.measure(key, maps_before)
            if self._share_key is not None:
                with self._tracing():
                    shared_programs.put((self._share_key, key, shared_programs.tracing_context()), exe)
            exe = self._compiled[key] = _Waited(exe) if self.waits_each_call else exe
        return exe

    def _shared(self, key):
        """Program `key` as another engine of the same structure compiled it, kept here too;
        None if none holds it."""
        if self._share_key is None:
            return None
        with self._tracing():
            exe = shared_programs.get((self._share_key, key, shared_programs.tracing_context()))
        if exe is not None:
            exe = self._compiled[key] = _Waited(exe) if self.waits_each_call else exe
        return exe

    def _fall_back(self, key, err: Exception) -> None:
        """Program `key` failed to lower or compile with a Pallas kernel in it: find the
        kernels whose XLA path makes it compile (each alone, then all), switch them to XLA
        for every program (those compiled before are dropped and recompile) and warn. If no
        such switch helps, the error was not a kernel's: re-raise it."""
        backends = kernels.resolve_backends(self.opts.backend)
        pallas = [k for k in kernels.KERNELS if getattr(backends, k) == "pallas"]
        trials = [[k] for k in pallas] + ([pallas] if len(pallas) > 1 else [])
        saved = (self.opts, self._drafter, self._compiled)
        self._fallback = False
        try:
            for trial in trials:
                new = backends._replace(**{k: "xla" for k in trial})
                self._build(dataclasses.replace(saved[0], backend=new), with_backend(saved[1], new))
                try:
                    getattr(self, key[0])(*key[1:])
                except Exception:  # noqa: BLE001
                    continue
                _warn_fallback(trial, err, self.placement.device)
                if self.on_fallback is not None:
                    self.on_fallback(new)
                return
            self._build(*saved[:2])
            self._compiled = saved[2]
            raise err
        finally:
            self._fallback = True

    def _rounds(self, k: int, b: int, target_params, draft_params, state, num_rounds, drafter=None):
        """One data shard's dispatch: R rounds of K over its first b slots (with `drafter`
        in place of the engine's, if given)."""
        new, outs, ran = step_lib.spec_rounds(self._graph, drafter or self._drafter, self.opts, k, b,
                                              target_params, draft_params, state, num_rounds,
                                              any_active=any_active(self.data))
        return summed_counters(self.data, state, new), step_lib.pack_rounds(outs, ran)

    def step(self, k: int, b: int):
        """The (K, bucket) program: `(target_params, draft_params, state, num_rounds) ->
        (state, outputs [MAX_ROUNDS, data * b, ...])`: `step.spec_rounds`'s rounds packed
        in one array (`step.pack_rounds`; `step.unpack_rounds` reads it); b slots of every
        data shard, shard after shard."""
        if not 0 <= k <= self.max_k:
            raise ValueError(f"K={k} is outside the compiled range 0..{self.max_k}")
        if b not in self.batch_buckets:
            raise ValueError(f"batch bucket {b} is not one of {self.batch_buckets}")
        return self._get(("step", k, b), lambda: self._lower_step(k, b))

    def _lower_step(self, k: int, b: int, drafter=None):
        return jax.jit(self._step_shards(functools.partial(self._rounds, k, b, drafter=drafter)),
                       donate_argnums=2, **self._step_outs).lower(*self._args, self._host(()))

    def step_with_drafter(self, drafter, k: int, b: int):
        """`step(k, b)` compiled with `drafter` in place of the engine's (one whose state has
        the same layout, e.g. a measurement's stand-in: the floors' verify-only step). Not
        cached, and no Pallas fallback: for measurements, not for serving."""
        if not 0 <= k <= self.max_k or b not in self.batch_buckets:
            raise ValueError(f"(K={k}, bucket {b}) is not a compiled step (K in 0..{self.max_k}, "
                             f"buckets {self.batch_buckets})")
        with self._tracing():
            lowered = self._lower_step(k, b, drafter)
        return lowered.compile()

    def _host(self, shape, dtype=jnp.int32):
        """A small host-side argument (replicated on a mesh)."""
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self.placement.replicated)

    def _per_shard(self, *shape, dtype=jnp.int32):
        """A host argument with one entry per data shard: [data, *shape]."""
        return self._host((self.data,) + shape, dtype)

    def prefill(self, n: int, c: int):
        """`(params..., state, rows, chunk, start, count, model_end, draft_end)`, each
        [data, n(, c)]."""
        ints = self._per_shard(n)
        return self._get(("prefill", n, c), lambda: self._prefill.lower(
            *self._args, ints, self._per_shard(n, c), ints, ints, ints, ints))

    def prefill_scored(self, n: int, c: int):
        """`prefill(n, c)` that also takes next_tokens [data, n, c] and returns the chunk's
        prompt logprobs, [data * n, c, 1 + 2 max_logprobs] (`step.pack_prompt_logprobs`), for
        requests with `SamplingParams.prompt_logprobs`. Compiled up front (`compile_all`)
        only by an engine with max_logprobs > 0; else on first use."""
        ints, chunk = self._per_shard(n), self._per_shard(n, c)
        return self._get(("prefill_scored", n, c), lambda: self._prefill_scored.lower(
            *self._args, ints, chunk, ints, ints, ints, ints, chunk))

    def admit(self, n: int):
        """`(state, SlotInit of [data, n] arrays)`."""
        return self._get(("admit", n), lambda: self._admit.lower(self._args[2], self._slot_init(n)))

    def _slot_init(self, n: int):
        """The abstract `SlotInit` of `admit(n)` (built only to lower it: a lookup is hot)."""
        f32, i32 = self._per_shard(n, dtype=jnp.float32), self._per_shard(n)
        extra = {name: self._per_shard(n, *shape, dtype=dtype)
                 for name, (shape, dtype, _) in self._drafter.admission_fields().items()}
        return step_lib.SlotInit(
            rows=i32, length=i32, limit=i32, min_length=i32, prompt_length=i32, temperature=f32,
            top_k=i32, top_p=f32, min_p=f32, repetition_penalty=f32, presence_penalty=f32,
            frequency_penalty=f32, bias_ids=self._per_shard(n, MAX_LOGIT_BIAS),
            bias_values=self._per_shard(n, MAX_LOGIT_BIAS, dtype=jnp.float32),
            bad_words=self._per_shard(n, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS),
            allowed_ids=self._per_shard(n, MAX_ALLOWED_TOKEN_IDS),
            seed=self._per_shard(n, dtype=jnp.uint32),
            stop_ids=self._per_shard(n, MAX_STOP_IDS), drafter_length=i32, drafter=extra)

    def slot_rows(self, m: int):
        """`(state, slots [data, m])`: each shard's rows of those slots (`step.slot_rows`)."""
        return self._get(("slot_rows", m), lambda: self._rows.lower(self._args[2], self._per_shard(m)))

    def move(self, m: int):
        """`(state, src [data, m], dst [data, m], slot_rows(m)(state, dst))`: m swaps per
        shard in turn, each src freed (`step.move_slots`; dst out of range: none)."""
        def lower():
            rows = jax.tree.map(lambda x: jax.ShapeDtypeStruct((self.data * m,) + x.shape[1:], x.dtype,
                                                               sharding=x.sharding),
                                step_lib.per_slot(self._args[2]))
            ints = self._per_shard(m)
            return self._move.lower(self._args[2], ints, ints, rows)
        return self._get(("move", m), lower)

    def copy(self, n: int):
        """`(state, src [data, n], dst [data, n])`: each shard copies n of its slots (a
        group's prefilled prompt into its siblings' slots; dst out of range: padding)."""
        ints = self._per_shard(n)
        return self._get(("copy", n), lambda: self._copy.lower(self._args[2], ints, ints))

    def compile_all(self, progress=None) -> int:
        """Compiles every program; returns how many. `progress(done, total)` is optional.
        A kernel fallback drops the programs compiled before it: they compile again."""
        keys = [("step", k, b) for b in self.batch_buckets for k in range(self.max_k + 1)]
        keys += [("prefill", n, c) for n in self.prefill_rows for c in self.prefill_chunks]
        if self.opts.top_logprobs:
            keys += [("prefill_scored", n, c) for n in self.prefill_rows for c in self.prefill_chunks]
        keys += [("admit", n) for n in self.prefill_rows]
        keys += [(f, m) for m in self.move_rows for f in ("slot_rows", "move")]
        keys += [("copy", n) for n in self.prefill_rows]
        # one program of each other kind first: what each kind takes is then measured when
        # the steps start, and the map budget can price everything left
        firsts = [next(k for k in keys if k[0] == kind) for kind in dict.fromkeys(k[0] for k in keys)
                  if kind != "step"]
        keys = firsts + [k for k in keys if k not in firsts]
        while True:
            backends = self.opts.backend
            priced = None  # the estimates everything left was last checked at
            for i, key in enumerate(keys):
                maps = self._maps
                if maps is not None and maps.measured_a_step() and maps.per_program != priced:
                    # everything left, at what each kind took so far: fail now, not after
                    # minutes (again only when the estimates moved: each compile since took
                    # about what it was priced at, and `_get` checks each one itself)
                    left = [k for k in keys[i:] if k not in self._compiled]
                    maps.check(left, f"this engine's {len(left)} remaining programs")
                    priced = dict(maps.per_program)
                getattr(self, key[0])(*key[1:])
                if progress:
                    progress(i + 1, len(keys))
            if self.opts.backend == backends:
                return len(keys)


def with_backend(drafter, backend):
    """`drafter` with its kernels backend replaced (drafters without one are returned)."""
    if dataclasses.is_dataclass(drafter) and "backend" in {f.name for f in dataclasses.fields(drafter)}:
        return dataclasses.replace(drafter, backend=backend)
    return drafter


def _warn_fallback(names, err: Exception, dev) -> None:
    lines = str(err).strip().splitlines()
    first = f"{type(err).__name__}: {lines[0] if lines else ''}"
    for name in names:
        warnings.warn(f"Pallas kernel {name!r} failed to compile on {dev.device_kind} "
                      f"({dev.platform}); using its XLA path instead. Error: {first}",
                      kernels.PallasFallbackWarning, stacklevel=4)
