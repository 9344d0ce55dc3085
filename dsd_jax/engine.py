"""SpecEngine: continuous batching over the K-bucket programs.

The host loop is thin: admit requests into free slots (chunked prefill), ask the
controller for K, dispatch the (K, bucket) program, and read back only the emitted
tokens and counts. Step N+1 is dispatched before the host blocks on step N's
outputs (JAX async dispatch), so the device does not wait on Python; the controller
therefore sees statistics one step old. Live requests stay packed in slots 0..n-1
(a finished request's slot receives the last live slot), so the bucket program
follows the live batch size. On a mesh with a "data" axis each data shard packs its own
live requests and the bucket follows the fullest shard (`dsd_jax.data_parallel`).
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import functools
import itertools
import math
import os
import statistics
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax import (bad_words, compilation, dead_ends, detokenize, drafters, inputs, kernels,
                     multihost, prefix_sharing, stop_strings)
from dsd_jax.admission import SlotAdmission
from dsd_jax.buckets import bucket_for, chunk_buckets, power_of_two_buckets, usable_chunks
from dsd_jax.config import SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.dispatch import DispatchPolicy
from dsd_jax.metrics import EngineStats
from dsd_jax.profile import Profile, ProfileMismatchWarning
from dsd_jax.request import Request, RequestOutput, engine_seed, references_seed, remember, top_entries
from dsd_jax.programs import Programs
from dsd_jax.sampling import SamplingParams, distinct_token_ids
from dsd_jax.sharding import DATA, Placement, heads_of, memory_report
from dsd_jax.state import MAX_STOP_IDS, init_state
from dsd_jax.step import StepOptions, unpack_rounds


class _Dispatch(NamedTuple):
    """A step program call whose outputs have not been read back yet."""

    out: Any  # the rounds' outputs, packed (`step.pack_rounds`), on device
    snapshot: list  # per output row (data shard after shard): its request, or None
    k: int
    context: int
    rounds: int  # rounds asked for
    after_prefill: bool  # a prefill ran just before it: its interval includes the prefill


def _placement(mesh, target, draft, max_batch_size: int) -> Placement:
    placement = Placement(mesh, heads_of(target.config), None if draft is None else heads_of(draft.config))
    data = placement.sizes[DATA]
    if max_batch_size % data:
        raise ValueError(f"max_batch_size {max_batch_size} must be a multiple of the mesh's 'data' "
                         f"axis ({data}): each data shard holds the same number of slots")
    return placement


def _matmul_precision(value: str | None) -> str | None:
    """`value` checked, or the precision in effect now when it is None."""
    if value is None:
        return jax.config.jax_default_matmul_precision
    try:
        with jax.default_matmul_precision(value):
            pass
    except ValueError as e:
        raise ValueError(f"matmul_precision {value!r} is not a jax.default_matmul_precision value: {e}") from None
    return value


def _eos_ids(given, tokenizer, vocab: int) -> tuple[int, ...]:
    """The engine's end-of-text ids: `given` checked against the vocabulary, or (None) the
    tokenizer's inside it (an id past the model's rows can never be emitted)."""
    if given is None:
        return tuple(t for t in inputs.tokenizer_eos_ids(tokenizer) if t < vocab)[:MAX_STOP_IDS]
    ids = distinct_token_ids(given, "eos_token_ids")
    outside = [t for t in ids if t >= vocab]
    if outside:
        raise ValueError(f"eos_token_ids has {outside[0]}, outside the vocabulary [0, {vocab})")
    if len(ids) > MAX_STOP_IDS:
        raise ValueError(f"eos_token_ids has {len(ids)} distinct ids; at most {MAX_STOP_IDS} are supported")
    return ids


class _FixedK:
    """A controller that always chooses `k` (`SpecEngine._run_every_step`)."""

    def __init__(self, k: int):
        self.k = k

    def choose_k(self, batch_size, context_len=None, request_ids=None, remaining=None) -> int:
        return self.k

    def observe(self, *args, **kwargs) -> None:
        pass


class SpecEngine(SlotAdmission):
    """Dynamic speculative decoding engine.

    target, draft: `dsd_jax.models.Transformer` (draft only for methods that need a model,
    such as "draft_model"; see `dsd_jax.drafters`).
    spec: `SpecConfig` (or a vLLM-style dict). max_batch_size slots, each holding up to
    max_seq_len tokens (prompt + output); on a mesh with a "data" axis of size D the slots
    are split evenly over the D shards and `batch_buckets` count slots per shard.
    `controller`: any object with
    `choose_k(batch_size, context_len=None, request_ids=None)` and `observe(...)`, and
    optionally `settled(batch_size, k, context_len)` (sure to choose k again until the
    batch changes: dispatches may then run up to 32 rounds, not 8 or 16), `end_run()` (a run
    ended: the choice for a dispatch it dropped is never observed) and `use_temperature(t)`
    (a run starts whose requests' median temperature is t); by default built from
    `spec` and `profile` (a `Profile` or a profile JSON path; default the spec's
    `dynamic.profile`). `seed` (an integer in [0, 2**32)) seeds requests given none.
    `eos_token_ids`: the end-of-text ids that end every completion, as stop ids do, unless
    its `SamplingParams.ignore_eos` (vLLM and transformers stop at the checkpoint's eos too);
    None: those `tokenizer` knows (`inputs.tokenizer_eos_ids`), none without a tokenizer. A
    checkpoint's generation_config may name more (Llama-3.1-Instruct's <|eom_id|>):
    `dsd_jax.loading.eos_token_ids(tokenizer, checkpoint_dir, vocab_size)` reads both.
    A controller whose `objective` is
    "makespan" also gets `remaining=` (tokens each live request may still produce)
    whenever no request is queued.
    Under `jax.distributed`, on a mesh spanning the processes, every process runs
    `generate` on the same requests and the engine keeps their K identical:
    `multihost_strategy` "broadcast" (process 0 decides) or "allgather" (every controller
    sees the slowest process's step times); see `dsd_jax.multihost`. An engine on one
    process's own devices (no mesh, or a local mesh) runs alone.
    `matmul_precision`: what the engine's programs compile at (a `jax.default_matmul_precision`
    value, e.g. "highest": float32 dots that a GPU would otherwise run in TF32); None: the one
    in effect when the engine is built. Fixed then, since the programs are compiled once and
    kept: a precision context around a later `generate` does not change them.
    `max_logprobs` (vLLM's): the most top log probabilities a request may ask for
    (`SamplingParams.logprobs` and `prompt_logprobs`). 0 (the default, vLLM's is 20): none,
    and the step programs compute none. N > 0: every step takes the N largest raw logprobs
    at each position, a top-k over the vocabulary, and reads them back with its other
    outputs (32 rounds x rows x (K+1) x 2N int32s a dispatch), for every request whether it
    asks or not; `warmup` also compiles the prefill programs of prompt logprobs.
    `share_prefixes` (vLLM's `enable_prefix_caching`, narrower): a new request whose prompt
    begins with `prefix_sharing.MIN_SHARED_PREFIX` (32) or more tokens of a prompt on its
    data shard, admitted with it or still running, copies those positions from that
    prompt's slot and prefills the rest (`dsd_jax.prefix_sharing`), where the engine's
    prefill cost model says it pays. Outputs are those of separate prefills up to
    floating-point rounding, as for any change of how a prompt is chunked. False: every
    prompt is prefilled whole.
    """

    def __init__(self, target, draft=None, spec: SpecConfig | Mapping | None = None, *,
                 max_batch_size: int = 64, max_seq_len: int = 2048, tokenizer=None, eos_token_ids=None,
                 batch_buckets: Sequence[int] | None = None, prefill_chunk: int = 256,
                 profile=None, controller=None, backend: str = "auto",
                 compilation_cache_dir: str | None = None, seed: int = 0, mesh=None,
                 multihost_strategy: str = "broadcast", matmul_precision: str | None = None,
                 max_logprobs: int = 0, share_prefixes: bool = True):
        spec = SpecConfig() if spec is None else spec
        spec = SpecConfig.from_dict(spec) if isinstance(spec, collections.abc.Mapping) else spec
        if not isinstance(spec, SpecConfig):
            raise TypeError(f"spec must be a SpecConfig or a mapping of its fields (vLLM's "
                            f"speculative_config), got {type(spec).__name__}")
        max_batch_size = inputs.check_size("max_batch_size", max_batch_size, 1)
        max_seq_len = inputs.check_size("max_seq_len", max_seq_len, 2)
        prefill_chunk = inputs.check_size("prefill_chunk", prefill_chunk, 1)
        seed = inputs.check_size("seed", seed, 0, 2**32 - 1)  # as SamplingParams.seed: refused, not wrapped
        max_logprobs = inputs.check_size("max_logprobs", max_logprobs, 0, target.config.vocab_size)
        if not isinstance(share_prefixes, bool):
            raise TypeError(f"share_prefixes must be True or False, got {share_prefixes!r}")
        if isinstance(profile, (str, os.PathLike)):  # as DynamicConfig(profile=) takes it
            profile = os.fspath(profile)
        elif profile is not None and not isinstance(profile, Profile):
            raise TypeError(f"profile must be a dsd_jax.profile.Profile or a profile JSON path, got "
                            f"{type(profile).__name__}")
        drafter_cls = drafters.get(spec.method)
        if drafter_cls.needs_model:
            if draft is None and hasattr(drafter_cls, "load_model"):
                # e.g. the EAGLE-3 head spec.model names (unset: the built-in target's), in the
                # target's dtype
                draft = drafter_cls.load_model(spec, target.config)
            if draft is None:
                raise ValueError(f"method {spec.method!r} needs a draft model")
            if draft.config.vocab_size != target.config.vocab_size and not drafter_cls.any_vocab_size:
                raise ValueError(f"draft vocab_size {draft.config.vocab_size} != target vocab_size "
                                 f"{target.config.vocab_size}: method {spec.method!r} needs the draft's "
                                 "vocabulary to be the target's")
        else:
            draft = None
        if compilation_cache_dir:
            compilation.enable_persistent_cache(compilation_cache_dir)
        self.spec = spec
        self.max_k = spec.max_k
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_logprobs = max_logprobs
        self.share_prefixes = share_prefixes
        self.tokenizer = tokenizer
        self.eos_token_ids = _eos_ids(eos_token_ids, tokenizer, target.config.vocab_size)
        self._bad_word_sequences = functools.lru_cache(maxsize=256)(self._tokenize_bad_words)
        self._bad_word_rows = functools.lru_cache(maxsize=256)(self._bad_words_row)
        self.placement = _placement(mesh, target, draft, max_batch_size)
        self.data = self.placement.sizes[DATA]
        self.slots_per_shard = per_shard = max_batch_size // self.data
        self.batch_buckets = inputs.check_batch_buckets(
            power_of_two_buckets(per_shard) if batch_buckets is None else batch_buckets, per_shard)
        self.prefill_chunk = prefill_chunk
        self.target_config = target.config
        self.draft_config = None if draft is None else draft.config
        for role, config in (("target", self.target_config), ("draft", self.draft_config)):
            if config is not None and max_seq_len > config.max_position_embeddings:
                warnings.warn(f"max_seq_len {max_seq_len} exceeds the {role}'s max_position_embeddings "
                              f"{config.max_position_embeddings}: positions past it were never trained",
                              stacklevel=2)
        target_graph, target_params = nnx.split(target)
        draft_graph, draft_params = (None, None) if draft is None else nnx.split(draft)
        self._target_params = self.placement.put_params(target_params, "target")
        self._draft_params = self.placement.put_params(draft_params, "draft")
        self.capacity = max_seq_len + self.max_k + 1
        # what free slots kept of finished requests, per shard {slot: prefix_sharing.Retained},
        # good while the state is written by runs alone (`state`'s setter counts writes)
        self._state_writes, self._retained_at = 0, -1
        self._retained: list[dict[int, prefix_sharing.Retained]] = [{} for _ in range(self.data)]
        self._finished = 0  # requests finished so far: a kept record's age (`Retained.finished`)
        # each kernel's backend, resolved once; under "auto" on GPU/TPU a Pallas kernel that
        # fails to compile falls back to XLA (`Programs`, `kernels.PallasFallbackWarning`)
        platform = kernels.default_platform(self.placement.device)
        backends = kernels.resolve_backends(backend, platform)
        fallback = backend == "auto" and platform in ("gpu", "tpu")
        self.drafter = drafter_cls.build(
            spec, None if draft is None else (draft_graph, draft.config), backends)
        self.drafter.feature_layers(target.config)  # a head for another target fails now, not in generate
        self.state = self._allocate_state()
        opts = StepOptions(acceptance=spec.acceptance, backend=backends, top_logprobs=max_logprobs)
        # Admission prefills the new requests together in the smallest batch bucket that
        # holds them (a too-large bucket made a 4-request admission cost a 64-row prefill).
        prefill_rows = self.batch_buckets
        # only the chunks some prompt can run in (a prompt holds at most max_seq_len - 1 tokens)
        prefill_chunks = usable_chunks(chunk_buckets(self.prefill_chunk), max_seq_len - 1)
        self.programs = Programs(target_graph, self.drafter, opts, self._target_params,
                                 self._draft_params, self.state, self.batch_buckets, self.max_k,
                                 prefill_rows, prefill_chunks, self.placement, fallback=fallback,
                                 matmul_precision=_matmul_precision(matmul_precision))
        if controller is None:
            # warns loudly when the profile was measured for other models, hardware or mesh
            # (fingerprints hash every weight: only computed when there is a profile)
            from dsd_jax.profiler import device_kind
            expect = lambda: dict(expect_fingerprints=self.fingerprints(), expect_device_kind=device_kind(self.placement.device),
                                  expect_mesh=self.placement.sizes,
                                  expect_kernel_backends=backends._asdict())
            if isinstance(profile, str):
                profile = Profile.load(profile, **expect())
            elif profile is None and spec.dynamic is not None and spec.dynamic.profile:
                profile = Profile.load(spec.dynamic.profile, **expect())
            elif profile is not None:
                profile.check_compatible(**expect(), source="the profile given to SpecEngine")
            # under data parallelism a step's time is set by the fullest shard: the
            # controller sees per-shard batch sizes
            controller = Controller(spec, profile, max_batch_size=per_shard,
                                    batch_buckets=self.batch_buckets)
            if profile is not None:  # timed with Pallas kernels that then fall back: say so then
                self.programs.on_fallback = lambda new: profile.check_compatible(
                    expect_kernel_backends=new._asdict(), source="the engine's profile")
            if spec.dynamic is not None and profile is not None:  # goodput: K from this profile
                fit = profile.fit_problems(self.max_k, per_shard, max_seq_len, self.batch_buckets[0])
                for problem in fit:
                    warnings.warn(f"{problem}; re-profile this engine (`dsd-jax profile`)",
                                  ProfileMismatchWarning, stacklevel=2)
        # agreement: None unless the mesh spans several processes (`jax.distributed`)
        self._policy = DispatchPolicy(controller, self.max_k,
                                      multihost.agreement(multihost_strategy, self.placement.mesh), self._budget)
        self.stats = self._new_stats()
        self._prefilled = False
        self._compiled_by = 0.0  # `Programs.compile_s` when the last dispatch was read back
        self._seed = seed
        self._warned: set[str] = set()  # `_warn_once` keys
        self._request_ids = itertools.count()
        self._calls = itertools.count()  # accepted generate/stream calls (`request.references_seed`)
        # held while a generate() or stream() is under way (`_run`); a lock, so that two
        # threads calling one engine cannot both get in
        self._run_lock = threading.Lock()

    @property
    def tokenizer(self):
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        # its decode as the outputs' text and stop strings need it (special tokens skipped):
        # made once a tokenizer, not every dispatch that scans for stop strings
        self._decode = None if tokenizer is None else detokenize.decoder(tokenizer)

    @property
    def state(self):
        """The device state (`dsd_jax.state.DecodeState`): every slot's caches and settings."""
        return self._state

    @state.setter
    def state(self, value) -> None:
        # a state written outside a run (the profiler's) no longer holds what runs retained
        self._state = value
        self._state_writes += 1

    def reset_prefix_cache(self) -> None:
        """Forgets what free slots kept of finished requests (vLLM's `reset_prefix_cache`):
        the next call shares prefixes only among its own prompts. New weights forget it by
        themselves, as does anything run on the state outside generate() and stream()."""
        self._retained = [{} for _ in range(self.data)]

    def _serving_bucket(self, fullest: int) -> int:
        """The batch bucket the next step runs in: the controller's (a larger bucket where
        its profile shows one faster at every cell), else the smallest that holds the
        fullest shard. A controller's answer is checked: an uncompiled bucket or one too
        small for the batch would fail late or drop rows."""
        serving = getattr(self.controller, "serving_bucket", None)
        b = None if serving is None else serving(fullest)
        if b is None:
            return bucket_for(fullest, self.batch_buckets)
        if b not in self.batch_buckets or b < fullest:
            raise RuntimeError(f"the controller chose batch bucket {b} for {fullest} live rows; "
                               f"the engine compiled {list(self.batch_buckets)}")
        return b

    @property
    def controller(self):
        """The controller the dispatch policy asks for K (assignable: the bench and tests
        swap one in between runs)."""
        return self._policy.controller

    @controller.setter
    def controller(self, controller) -> None:
        self._policy.controller = controller

    @property
    def agreement(self):
        """How the processes under `jax.distributed` agree on K (`dsd_jax.multihost`), or None
        on one process; fixed when the engine is built."""
        return self._policy.agreement

    # ---- weights ------------------------------------------------------------------------
    def set_params(self, target=None, draft=None, *, copy: bool = True) -> None:
        """Swaps in new weights: a model, its `nnx.state`, or that state as a pure dict
        (`nnx.to_pure_dict`); compiles none of the engine's programs (JAX may compile a small
        resharding program the first time weights come from another device layout). Every
        tree given is checked before any is
        swapped in (a refused call changes nothing; the error names the first leaf that
        differs, or for a model the config fields that differ from the engine's: the engine
        keeps its compiled graph), and goes where the weights it replaces are: device to
        device, on a mesh onto its layout.

        copy: the engine keeps weights of its own, so the caller may donate or delete its
        arrays afterwards (a jitted training step donating its params, the usual RL loop,
        would otherwise delete the engine's). copy=False saves that copy's memory (one set
        of weights on the device); the caller then keeps its arrays alive and unchanged
        while the engine serves them. (An engine built from a model serves the model's own
        arrays until the first `set_params`.)

        Refused while a `stream()` is suspended mid-run: its next rounds would run the new
        weights over the old ones' KV cache, a completion of neither policy."""
        self._check_idle("set_params")
        new = {}
        for role, given in (("target", target), ("draft", draft)):
            if given is None:
                continue
            old = self._target_params if role == "target" else self._draft_params
            if old is None:
                raise ValueError("this engine has no draft model")
            config = self.target_config if role == "target" else self.draft_config
            state = inputs.params_like(given, old, role, config)
            new[role] = jax.device_put(state, jax.tree.map(lambda x: x.sharding, old),
                                       may_alias=False if copy else None)
        self._target_params = new.get("target", self._target_params)
        self._draft_params = new.get("draft", self._draft_params)
        self.reset_prefix_cache()  # the slots hold the old weights' KV

    def set_params_from(self, mapping, state, role: str = "target") -> None:
        """Weights from a trainer's own param tree (an `nnx.State` or nested dicts of another
        model class: Tunix, MaxText, your NNX model), mapped onto ours by a declared
        `dsd_jax.param_mapping.ParamMapping`. Device to device only (transfer guards hold);
        compiles none of the engine's programs; a leaf the mapping misses, leaves unused or
        gets the wrong shape from is a ValueError naming it."""
        from dsd_jax.param_mapping import set_params_from
        self._check_idle("set_params_from")
        set_params_from(self, mapping, state, role)

    @staticmethod
    def _running_error() -> RuntimeError:
        return RuntimeError(
            "this engine is already running a stream() or generate() call (one run at a "
            "time: a second would take the first's slots). Exhaust the first stream or "
            "close it (its .close(); breaking out of a `for` loop over engine.stream(...) "
            "closes it) before starting another run, or use a second engine")

    def _numbered(self, checked: list[tuple]) -> list[Request]:
        """`_make_requests`, refused first when a run is under way (a refused call takes
        no request ids)."""
        if self._run_lock.locked():
            raise self._running_error()
        return self._make_requests(checked)

    def _check_idle(self, what: str, harm: str = "its remaining tokens would come from the new "
                    "weights over the old weights' KV cache, a completion of neither policy") -> None:
        if self._run_lock.locked():
            raise RuntimeError(f"{what} while a stream() or generate() run is under way (a "
                               f"ThreadedEngine's or SpecRollout's too): {harm}. Let it finish "
                               "(a ThreadedEngine: .join()) or close the stream (.close(), or leave "
                               "its for loop) first")

    def new_state(self):
        """A fresh device state (every slot free) in the engine's layout."""
        return self.placement.new_state(lambda: init_state(
            self.target_config, self.drafter, self.max_batch_size, self.capacity, self.max_k))

    def _allocate_state(self):
        """The first device state; running out of memory names the sizes that set it."""
        try:
            return self.new_state()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            report = self._sizes_report()
            kv = sum(report["kv_cache"].values())
            raise MemoryError(
                f"the engine's decode state does not fit in device memory: its KV caches take "
                f"{kv / 2 ** 30:,.1f} GiB per device (max_batch_size {self.max_batch_size} slots x "
                f"{self.capacity} positions: max_seq_len {self.max_seq_len} + max K {self.max_k} + 1"
                f"), the whole state {(report['total'] - sum(report['params'].values())) / 2 ** 30:,.1f} "
                f"GiB. Lower max_seq_len or max_batch_size (engine.memory_report() sizes a setting "
                f"without allocating)") from None

    def _freed_state(self):
        """The state with every slot free: the same buffers when they are intact (no second
        copy of the caches), a fresh state when a failed call left its donated ones deleted."""
        if any(x.is_deleted() for x in jax.tree.leaves(self.state)):
            return self.new_state()
        active = self.state.active
        return self.state._replace(active=jnp.zeros_like(active, device=active.sharding))

    def memory_report(self) -> dict:
        """Bytes per device of the params, the KV caches and the rest of the state (see
        `dsd_jax.sharding.memory_report`), and ``scratch``: the most one compiled program needs
        beyond those (`Programs.scratch_bytes`; None until `warmup` or a first call compiled
        them), with ``total_with_scratch``."""
        report = self._sizes_report()
        report["scratch"] = scratch = self.programs.scratch_bytes()
        report["total_with_scratch"] = None if scratch is None else report["total"] + scratch
        return report

    def _sizes_report(self) -> dict:
        """`sharding.memory_report` of this engine's sizes (nothing compiled or allocated)."""
        return memory_report(self.target_config, self.draft_config, self.spec, self.placement.sizes,
                             self.max_batch_size, self.max_seq_len)

    def warmup(self, progress: Callable[[int, int], None] | None = None, run: bool = True) -> int:
        """Compiles every program up front; returns the number of programs. Under
        backend="auto" on GPU/TPU a Pallas kernel that fails to compile is replaced by its
        XLA path, with a `kernels.PallasFallbackWarning` naming the kernel, the device and
        the error (`kernel_backends` says what runs); backend="pallas" raises instead.
        `run`: then runs rows through every (K, batch bucket) step (`_run_every_step`): on
        XLA:CPU a program's first rows cost it far more than the next (a K's first generate
        on the built-in pair took ~120 ms more than its second), and a dynamic controller
        first trying a K mid-generate paid that in the caller's time."""
        n = self.programs.compile_all(progress)
        self.drafter = self.programs.drafter
        if run:
            self._run_every_step()
        return n

    def _run_every_step(self) -> None:
        """Generates one token past a step at every (K, bucket): throwaway one-token prompts
        filling the bucket in every data shard, under a fixed-K controller (`_stand_in`)."""
        tokens = max(1, min(self.max_k + 2, self.max_seq_len - 1))
        for b in self.batch_buckets:
            for k in range(self.max_k + 1):
                with self._stand_in(_FixedK(k)):
                    self.generate([[1]] * (b * self.data),
                                  SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, seed=0))

    def _new_stats(self) -> EngineStats:
        """Statistics counting what the runs spend compiling apart (`EngineStats`)."""
        return EngineStats(self.max_k, compile_clock=lambda: self.programs.compile_s)

    @contextlib.contextmanager
    def _stand_in(self, controller):
        """Runs under `controller` and fresh statistics (warm-up, the profiler's acceptance
        runs), leaving what callers see as it was: their controller, their statistics, and the
        request and call counts that unseeded requests' seeds come from."""
        saved_controller, saved_stats = self.controller, self.stats
        next_request, next_call = next(self._request_ids), next(self._calls)
        self.controller, self.stats = controller, self._new_stats()
        try:
            yield
        finally:
            self.controller, self.stats = saved_controller, saved_stats
            self._request_ids, self._calls = itertools.count(next_request), itertools.count(next_call)

    @property
    def kernel_backends(self) -> dict[str, str]:
        """The backend each kernel runs on, e.g. {"attention": "pallas", "rejection": "xla"}
        (after a fallback at warmup, the XLA path for the kernel that failed)."""
        return self.programs.kernel_backends

    def metrics(self) -> dict:
        """`stats` as a dict, with the controller's calibration (predicted vs measured).

        "steps" and "k_hist" count rounds (a dispatch runs up to 8, 16 at a K the controller
        holds over several rows, or 32 when settled; `dispatch.py`);
        the controller's "k_choices" counts dispatches (one choice of K each) and its
        "k_steps" rounds again. "tokens" counts emitted tokens, including a stop token
        that `include_stop_token=False` then drops from the output. "compile_s" is what the
        runs spent compiling programs on their first use (0 after `warmup()`): "tokens_per_s"
        leaves it out, each request's "tpot_ms" does not. Counts run from the last
        `reset_metrics()` (`stats.reset()` resets the engine's counts only).
        """
        ctl = getattr(self.controller, "stats", None)
        return self.stats.to_dict(ctl() if callable(ctl) else None)

    def reset_metrics(self) -> None:
        """Zero the counts `metrics()` reports, the engine's and the controller's (per
        training iteration, say). What the controller has learnt (acceptance, latency
        corrections, the K it holds) stays, so the next run starts warm."""
        self.stats.reset()
        reset = getattr(self.controller, "reset_counts", None)
        if callable(reset):
            reset()

    def fingerprints(self) -> dict[str, str]:
        """Model fingerprints (role -> str) as profiles record them (`dsd_jax.profiler`)."""
        from dsd_jax.profiler import engine_fingerprints
        return engine_fingerprints(self)

    # ---- requests -----------------------------------------------------------------------
    def _token_ids(self, text, what: str) -> list[int]:
        """A prompt or reference as token ids (a string needs the engine's tokenizer)."""
        if isinstance(text, str):
            if self.tokenizer is None:
                raise ValueError(f"{what} is a string; strings need an engine with a tokenizer")
            inputs.check_text(text, what)
            text = inputs.encode_text(self.tokenizer, text)
        ids = inputs.token_id_list(text, what)
        vocab = self.target_config.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            raise ValueError(f"{what} has token ids outside the vocabulary [0, {vocab})")
        return ids

    def _reference(self, given, what: str) -> tuple[list[int], int | None]:
        """A reference as (token ids, the seed its noise was drawn from, None if unknown): a
        `RequestOutput` carries its `noise_seed`, token ids or a string do not."""
        if isinstance(given, RequestOutput):
            return self._token_ids(given.token_ids, what), given.noise_seed
        return self._token_ids(given, what), None

    def _request_params(self, sp: SamplingParams, i: int) -> SamplingParams:
        """Prompt i's SamplingParams checked against this engine before anything runs: a
        value the device's int32/uint32 arrays cannot hold would otherwise fail at admission,
        after the prefill and the other requests' work, and lose every output of the call.
        Its stop ids gain the engine's `eos_token_ids` unless `ignore_eos`."""
        vocab = self.target_config.vocab_size
        given = len(sp.stop_token_ids)
        if not sp.ignore_eos and self.eos_token_ids:
            sp = dataclasses.replace(sp, stop_token_ids=sp.stop_token_ids + tuple(
                t for t in self.eos_token_ids if t not in sp.stop_token_ids))
        if len(sp.stop_token_ids) > MAX_STOP_IDS:
            added = len(sp.stop_token_ids) - given
            eos = (f" and {added} more of the engine's eos_token_ids (ignore_eos=True leaves those "
                   "out)" if added else "")
            raise ValueError(f"request {i}: {given} stop_token_ids{eos}: at most {MAX_STOP_IDS} stop "
                             "ids are supported")
        for t in sp.stop_token_ids:
            if t >= vocab:  # could never match (and may not fit int32)
                raise ValueError(f"request {i}: stop_token_ids has {t}, outside the vocabulary "
                                 f"[0, {vocab})")
        for name, ids in (("logit_bias", sp.logit_bias), ("allowed_token_ids", sp.allowed_token_ids)):
            outside = [t for t in ids or () if t >= vocab]
            if outside:
                raise ValueError(f"request {i}: {name} has token id {outside[0]}, outside the "
                                 f"vocabulary [0, {vocab})")
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(sp, name)
            if asked is not None and asked > self.max_logprobs:
                raise ValueError(f"request {i}: {name}={asked} asks for more top log probabilities "
                                 f"than this engine computes (max_logprobs={self.max_logprobs}): build "
                                 f"it with SpecEngine(..., max_logprobs={asked}) or more")
        if sp.seed is not None and sp.seed + sp.n - 1 >= 2 ** 32:
            raise ValueError(f"request {i}: seed {sp.seed} with n={sp.n}: completion g draws from "
                             f"seed + g, which must stay below 2**32")
        if sp.min_tokens and len(sp.stop_token_ids) >= vocab:
            raise ValueError(f"request {i}: min_tokens={sp.min_tokens} bans every stop id before "
                             f"then, and here they are the whole vocabulary of {vocab}: nothing is "
                             "left to draw")
        if sp.top_k > vocab:  # the same distribution (every token kept), and it fits int32
            sp = dataclasses.replace(sp, top_k=vocab)
        if sp.stop and self.tokenizer is None:
            raise ValueError(f"request {i}: stop strings {list(sp.stop)!r} are matched in the "
                             "decoded text: they need an engine with a tokenizer "
                             "(SpecEngine(..., tokenizer=...))")
        if sp.bad_words:
            if self.tokenizer is None:
                raise ValueError(f"request {i}: bad_words {list(sp.bad_words)!r} are tokenized: they need "
                                 "an engine with a tokenizer (SpecEngine(..., tokenizer=...))")
            try:
                self._bad_word_sequences(sp.bad_words, id(self.tokenizer))
            except ValueError as e:
                raise ValueError(f"request {i}: {e}") from None
        return sp

    def _check_drawable(self, sp: SamplingParams, room: int, i: int) -> None:
        """Refuses a request whose allowed_token_ids, bad words and min_tokens can ban every
        id at some position of its first `room` tokens: the sampler would draw from all
        -inf (NaN logprobs, a banned id) instead of failing (`dead_ends`)."""
        if not (sp.allowed_token_ids or sp.bad_words):
            return
        sequences = self._bad_word_sequences(sp.bad_words, id(self.tokenizer)) if sp.bad_words else ()
        stuck = dead_ends.first_stuck(sequences, sp.allowed_token_ids, self.target_config.vocab_size,
                                      sp.stop_token_ids, sp.min_tokens)
        if stuck is None or stuck[0] >= room:
            return
        position, tail = stuck
        subject = (f"allowed_token_ids {list(sp.allowed_token_ids)} leaves" if sp.allowed_token_ids
                   else f"bad_words {list(sp.bad_words)!r} leave")
        why = "each is a one-token bad word" if not tail else "each is banned by a bad word there"
        why += " or a stop id min_tokens bans" if position < sp.min_tokens else ""
        where = "first" if not tail else f"at completion token {position + 1} after one ending in {list(tail)}"
        raise ValueError(f"request {i}: {subject} no token to draw {where}: {why}")

    def _tokenize_bad_words(self, words: tuple[str, ...], tokenizer_id: int) -> tuple[tuple[int, ...], ...]:
        """A request's bad words as token sequences, memoised per words and tokenizer
        (`tokenizer_id`: the tokenizer's id(), so a replaced one re-tokenizes), as are their
        device rows (`_bad_word_rows`, `bad_words.rows`)."""
        return tuple(bad_words.token_sequences(words, self.tokenizer, self.target_config.vocab_size))

    def _bad_words_row(self, words: tuple[str, ...], tokenizer_id: int) -> np.ndarray:
        return bad_words.rows(self._bad_word_sequences(words, tokenizer_id))

    def _check_call(self, prompts, sampling, references=None, memory=None) -> list[tuple]:
        """Every prompt of a call as (prompt ids, SamplingParams, references), every value
        checked (nothing can fail once it runs). Takes no request ids: a refused call
        leaves the seeds of later unseeded requests as they were."""
        prompts = inputs.prompt_list(prompts)
        references = inputs.reference_lists(references, len(prompts))
        params = inputs.sampling_list(sampling, len(prompts))
        checked = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            prompt = self._token_ids(prompt, f"prompt {i}")
            sp = self._request_params(sp, i)
            refs = [] if memory is None else memory.entries(prompt)  # (tokens, noise seed)
            refs += [self._reference(c, f"reference {j} of prompt {i}") for j, c in enumerate(references[i])]
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            if len(prompt) >= self.max_seq_len:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens; max_seq_len {self.max_seq_len} "
                                 "leaves no room to generate")
            self._check_drawable(sp, min(sp.max_tokens or self.max_seq_len, self.max_seq_len - len(prompt)), i)
            checked.append((prompt, sp, refs))
        # a max_tokens that does not fit in the slot stops at max_seq_len, finish_reason
        # "length" (as vLLM's max_model_len)
        capped = [i for i, (prompt, sp, _) in enumerate(checked)
                  if sp.max_tokens is not None and len(prompt) + sp.max_tokens > self.max_seq_len]
        if capped:
            self._warn_once("capped", f"{len(capped)} request(s) (first: prompt {capped[0]}) ask for more "
                            f"tokens than max_seq_len {self.max_seq_len} leaves after the prompt: they "
                            f"stop there, finish_reason 'length'")
        if (memory is not None or any(references)) and not self.drafter.reads_references:
            self._warn_once("references", f"method {self.spec.method!r} drafts without references: "
                            f"references= and memory= are not read (a memory still stores the "
                            f"completions; method 'suffix' reads them)")
        return checked

    def _warn_once(self, key: str, message: str) -> None:
        """A UserWarning at the caller of generate/stream, the first time only for this engine
        (an RL loop calls them thousands of times)."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message + " (warned once per engine)", UserWarning, stacklevel=4)

    def _make_requests(self, checked: list[tuple]) -> list[Request]:
        """The requests of a checked call, numbered (an unseeded request's seed hashes its id)."""
        mix_references = self.drafter.reads_references and self.spec.acceptance == "rejection"
        call = next(self._calls)
        requests = []
        for i, (prompt, sp, refs) in enumerate(checked):
            tokens = [ids for ids, _ in refs]
            group = -1
            for g in range(sp.n):
                rid = next(self._request_ids)
                group = rid if g == 0 else group
                seed = engine_seed(self._seed, rid) if sp.seed is None else sp.seed + g
                if refs and mix_references:
                    seed = references_seed(seed, refs, call)
                requests.append(Request(rid, prompt, sp, seed, i, g, group, tokens))
        return requests

    def check(self, prompts, sampling: SamplingParams | Sequence[SamplingParams] | None = None,
              references=None, memory=None) -> None:
        """Raises the ValueError `generate` would raise for these requests, running and
        compiling nothing: a script can refuse them before `warmup()` spends minutes."""
        self._check_call(prompts, sampling, references, memory)

    def generate(self, prompts, sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 return_logprobs: bool = False, progress: Callable[[int], None] | None = None,
                 references=None, memory=None,
                 on_output: Callable[[int, RequestOutput], None] | None = None) -> list[RequestOutput]:
        """Generates for every prompt; outputs in prompt order (a prompt's n completions
        adjacent). More requests than slots queue.

        references: per prompt, earlier continuations of it (token-id lists, strings, or
        earlier `RequestOutput`s: those carry the seed their noise came from, see
        `SamplingParams`) that a drafter may copy from (method "suffix"); memory: a
        `dsd_jax.rollout_memory.RolloutMemory` giving each prompt its stored completions
        as references and storing this call's completions when it returns.
        progress: called with the number of finished requests each time it grows.
        on_output: called as each request finishes (in the order they finish) with its index
        in the returned list and its `RequestOutput`: a batch script can keep what is done
        before the call returns (`dsd-jax generate --out` writes it as it goes).
        """
        requests = self._numbered(self._check_call(prompts, sampling, references, memory))
        index = {id(r): i for i, r in enumerate(requests)} if on_output else {}
        done = 0
        with contextlib.closing(self._run(requests)) as run:  # closed even if a callback raises
            for r, _ in run:
                # a request's last event is the only one after it finished (counting them
                # all at every event was quadratic: 8000 prompts took 28 s, not 1.7 s)
                if r.finish_reason is not None:
                    done += 1
                    if progress:
                        progress(done)
                    if on_output:
                        on_output(index[id(r)], self._output(r, return_logprobs))
        remember(memory, requests)
        return [self._output(r, return_logprobs) for r in requests]

    def stream(self, prompts, sampling=None, references=None, memory=None,
               on_output: Callable[[int, RequestOutput], None] | None = None,
               return_logprobs: bool = False) -> Iterator[tuple[int, list[int]]]:
        """Yields (output index, new token ids) as tokens are committed; the output index is
        the position `generate` would return the completion at (the prompt index when n=1).
        A completion's tokens, joined, are `generate`'s `token_ids` (a stop token that
        `include_stop_token=False` drops is never yielded).

        The inputs are checked here, when it is called; the run starts at the first `next`
        (and numbers the requests then: a stream never started leaves the seeds of later
        unseeded requests as they were).
        An engine runs one stream or `generate` at a time: until this stream is exhausted or
        closed (`.close()`, leaving its `for` loop, or dropping it), another raises.

        references, memory: as in `generate`; the memory stores the completions once the
        stream is exhausted (a stream closed early stores none of its partial ones).
        on_output: called as each completion finishes, with its output index and its
        `RequestOutput` (finish reason, text, and logprobs with `return_logprobs`), just
        before its last tokens are yielded (a completion may end with no new tokens: a stop
        token left out): how a consumer learns that an index is done."""
        return self._stream(self._check_call(prompts, sampling, references, memory), memory,
                            on_output, return_logprobs)

    def _stream(self, checked: list[tuple], memory=None, on_output=None,
                return_logprobs: bool = False) -> Iterator[tuple[int, list[int]]]:
        requests = self._numbered(checked)
        index = {r.request_id: i for i, r in enumerate(requests)}
        # closing the stream closes its run at once, which frees the slots and the engine
        with contextlib.closing(self._run(requests)) as run:
            for req, new in run:
                if on_output and req.finish_reason is not None:
                    on_output(index[req.request_id], self._output(req, return_logprobs))
                if new:
                    yield index[req.request_id], new
        remember(memory, requests)

    def _output(self, r: Request, return_logprobs: bool) -> RequestOutput:
        text = None if self.tokenizer is None else detokenize.completion_text(
            self._decode, r.prompt, r.tokens, r.ended_by_stop_id, r.params.include_stop_str_in_output)
        if r.text_end is not None:  # a stop string ended it: the text ends there
            text = text[:r.text_end]
        # the n completions of a prompt share one prompt list and one prompt_logprobs list:
        # each output gets its own copies
        prompt_logprobs = (None if r.prompt_logprobs is None
                           else [None if e is None else dict(e) for e in r.prompt_logprobs])
        return RequestOutput(r.request_id, list(r.prompt), list(r.tokens), r.finish_reason,
                             list(r.logprobs) if return_logprobs else None,
                             list(r.raw_logprobs) if return_logprobs else None, text,
                             r.prompt_index, r.index, r.seed, r.stop_reason,
                             None if r.params.logprobs is None else list(r.top_logprobs), prompt_logprobs)

    # ---- the loop -----------------------------------------------------------------------
    def _budget(self, r: Request) -> int:
        """Most tokens request r may produce: its max_tokens, capped by the slot's length
        (`_warn_capped` says so when a call's max_tokens does not fit; None: the slot's)."""
        room = self.max_seq_len - len(r.prompt)
        return room if r.params.max_tokens is None else min(r.params.max_tokens, room)

    def _process(self, d: _Dispatch) -> tuple:
        """Reads one dispatch's outputs back (the only device->host copy in the loop) and
        applies its rounds as if each had been its own step: stats and the controller see
        every round, a row finishing in round j is live in rounds 0..j only. Each request
        gets one event with everything the dispatch emitted for it (it all arrived at once)."""
        out, snapshot, k, context = d.out, d.snapshot, d.k, d.context
        (tokens, n_emit, n_acc, done, lp, raw, top_lp, top_ids), R = unpack_rounds(jax.device_get(out))
        rows = np.array([i for i, r in enumerate(snapshot) if r is not None and r.finish_reason is None],
                        np.int64)
        if R == 0:  # no row of the bucket was active on the device
            if len(rows):  # a second run took the slots (`_run` refuses one): do not spin
                raise RuntimeError(f"a dispatch ran no round while {len(rows)} requests were live: "
                                   "the device state was changed under this run")
            return [], []
        now = time.perf_counter()
        start = self.stats.last_step_time
        # a program compiled since the last read-back (this step's, the next one's, a prefill's
        # or a move's on first use) is inside this interval: no round of it times its program
        compiled, self._compiled_by = self.programs.compile_s != self._compiled_by, self.programs.compile_s
        times = (start + (now - start) * np.arange(1, R + 1) / R).tolist()  # rounds share it evenly
        bucket = len(snapshot) // self.data
        # the round each row finished in (R if it is still running)
        last = np.where(done[:, rows].any(0), done[:, rows].argmax(0), R)
        n_emit, stopped_by = n_emit.copy(), {}  # a stop string cuts a row's counts below
        emitted_by = lambda i, j_end: ((np.arange(tokens.shape[-1]) < n_emit[:, i, None])
                                       & (np.arange(R) <= j_end)[:, None])  # [R, K+1]
        for at, i in enumerate(rows):
            r = snapshot[i]
            if r.params.stop:  # a stop string ends the row where it completes (`stop_strings`)
                hit = self._stop_string(r, tokens[:, i], emitted_by(i, last[at]))
                if hit is not None:
                    stopped_by[i], j, count = hit
                    last[at] = j  # its rounds after j never happened, for the stats too
                    n_emit[max(j, 0):, i] = 0
                    if j >= 0:
                        n_emit[j, i] = count
        for j in range(R):
            live = rows[last >= j]
            if not len(live):
                break
            per_shard = None if self.data == 1 else np.bincount(live // bucket, minlength=self.data)
            dt = self.stats.record_step(k, len(live), n_acc[j, live], int(n_emit[j, live].sum()),
                                        times[j], None if per_shard is None else per_shard.tolist(),
                                        after_prefill=d.after_prefill, bucket=bucket, context=context,
                                        compiled=compiled)
            # In the pipelined steady state the gap between two results is the dispatch's
            # time; a gap that contains a prefill or a compile is not, for any of its rounds.
            # A compile goes through the processes' agreement as an infinite time, so that a
            # compile in any process leaves the round untimed in all (their controllers stay
            # in step); a prefill runs in all of them alike.
            step_time = None if d.after_prefill else math.inf if compiled else dt
            if self.agreement is not None:
                step_time = self.agreement.step_time(step_time)
            if step_time == math.inf:
                step_time = None
            # The round's time is the program's, which runs every row of its batch bucket:
            # rows that finished (in an earlier round, or in the dispatch before, which this
            # one was launched behind) still fill it, so it is credited to that bucket.
            t0 = time.perf_counter()
            self.controller.observe(k, n_acc[j, live], step_time_s=step_time,
                                    request_ids=[snapshot[i].request_id for i in live],
                                    context_len=context, batch_size=bucket)
            self.stats.add_controller_time(t0)
        events, finished = [], []
        for i, j_end in zip(rows, last):
            r = snapshot[i]
            emitted = emitted_by(i, j_end)
            before = len(r.tokens)
            if emitted.any():
                r.tokens += tokens[:, i][emitted].tolist()
                r.logprobs += lp[:, i][emitted].tolist()
                r.raw_logprobs += raw[:, i][emitted].tolist()
                if r.params.logprobs is not None:
                    r.top_logprobs += top_entries(tokens[:, i][emitted], raw[:, i][emitted],
                                                  top_ids[:, i][emitted], top_lp[:, i][emitted],
                                                  r.params.logprobs)
                r.first_token_time = r.first_token_time or times[emitted.any(1).argmax()]
            if j_end < R:  # finished: on the device, or by a stop string here
                if i in stopped_by:
                    r.finish_reason, r.stop_reason, r.text_end = "stop", stopped_by[i].stop, stopped_by[i].text_end
                else:
                    stopped = bool(r.tokens) and r.tokens[-1] in r.params.stop_token_ids
                    r.finish_reason = "stop" if stopped else "length"
                    if stopped and (r.params.ignore_eos or r.tokens[-1] not in self.eos_token_ids):
                        r.stop_reason = r.tokens[-1]  # None for the end-of-text ids, as vLLM
                    if stopped and not r.params.include_stop_token:
                        del r.tokens[-1], r.logprobs[-1], r.raw_logprobs[-1], r.top_logprobs[-1:]
                r.finish_time = times[max(j_end, 0)]
                finished.append(r)
                self._forget([r])
            # the event carries what the output keeps (after a dropped stop token), so the
            # stream's tokens join to `generate`'s; a finishing row always gets one (progress)
            if len(r.tokens) > before or j_end < R:
                events.append((r, r.tokens[before:]))
        return events, finished

    def _stop_string(self, r: Request, tokens: np.ndarray, emitted: np.ndarray):
        """If this dispatch's tokens of request r (`tokens` [R, K+1], `emitted` the mask of
        those it emitted) complete one of its stop strings: (the `stop_strings.Match`, the
        round of the last token kept, how many tokens that round keeps); else None."""
        new = tokens[emitted].tolist()
        if not new:
            return None
        committed, floor = len(r.tokens), r.params.min_tokens
        decode = self._decode
        r.tokens += new  # scanned in place, then taken off again: no copy of the completion
        try:
            if len(r.tokens) <= floor:  # as vLLM, no match ends in the first min_tokens' text
                r.stop_text.extend(decode, r.tokens)
                return None
            if r.stop_text.read < floor:
                r.stop_text.extend(decode, r.tokens[:floor])
            hit = stop_strings.scan(decode, r.tokens, max(committed, floor + 1), r.params.stop,
                                    r.stop_text, r.params.include_stop_str_in_output)
        finally:
            del r.tokens[committed:]  # the caller commits what the dispatch keeps
        if hit is None:
            return None
        kept = hit.keep - committed  # of the new ones (0: the match ended in older ones)
        if kept == 0:
            return hit, -1, 0
        rounds, places = np.nonzero(emitted)  # in token order
        return hit, int(rounds[kept - 1]), int(places[kept - 1]) + 1

    def _forget(self, requests: list[Request], finished: bool = True) -> None:
        """The controller's per-request state of `requests` is dropped: finished, or (not
        `finished`) abandoned, which the library's controller does not learn from (another
        controller's `forget_request` is called with the id alone)."""
        forget = getattr(self.controller, "forget_request", None)
        if forget:
            kw = {} if finished or not isinstance(self.controller, Controller) else {"finished": False}
            for r in requests:
                forget(r.request_id, **kw)

    def _run(self, requests: list[Request], arrivals: Callable[[], list[Request]] | None = None):
        """Runs `requests` to the end, yielding (request, its new tokens) as dispatches are
        read back. `arrivals`: called before each admission for requests that joined since
        (`dsd_jax.threaded`: other threads' calls), queued behind the ones waiting and
        added to `requests`; the run ends when none is left and none arrived."""
        # Every run packs its requests from slot 0 of the one device state: a second run
        # while a stream is suspended would overwrite the first's slots and lose its tokens.
        if not self._run_lock.acquire(blocking=False):
            raise self._running_error()
        queue = collections.deque(requests)
        shards: list[list[Request]] = [[] for _ in range(self.data)]  # live, in slot order
        inflight = None
        finished_normally = False
        if self._retained_at != self._state_writes:  # the state was written since the last run
            self.reset_prefix_cache()
        try:  # released in the finally: also when a stream is closed or dropped
            self._policy.begin_run()
            self.stats.begin_run()
            self._compiled_by = self.programs.compile_s  # (warm-up's compiles are not this run's)
            use_temperature = getattr(self.controller, "use_temperature", None)
            while True:
                if arrivals is not None:
                    joined = arrivals()
                    queue.extend(joined)
                    requests.extend(joined)
                if not (queue or any(shards) or inflight):
                    break
                if use_temperature is not None:  # once there is work: the profile's acceptance there, as prior
                    use_temperature(statistics.median_low(r.params.temperature for r in requests))
                    use_temperature = None
                free = self.max_batch_size - sum(map(len, shards))
                if queue and free:
                    new = [queue.popleft() for _ in range(min(len(queue), free))]
                    self._place(new, shards)
                    self._admit(new, shards, refilled=bool(queue))
                    self._prefilled = True
                dispatched = None
                live = [r for shard in shards for r in shard]
                if live and not self._policy.finishes_in_flight(live, inflight):
                    fullest = max(map(len, shards))
                    context = max(len(r.prompt) + len(r.tokens) for r in live)
                    t0 = time.perf_counter()
                    k = self._policy.choose_k(live, fullest, context, refilled=bool(queue))
                    rounds = self._policy.rounds(live, k, bool(queue), inflight, fullest, context,
                                                 self._prefilled)
                    self.stats.add_controller_time(t0)
                    b = self._serving_bucket(fullest)
                    self.state, out = self.programs.step(k, b)(
                        self._target_params, self._draft_params, self.state, np.int32(rounds))
                    snapshot = [shard[i] if i < len(shard) else None for shard in shards
                                for i in range(b)]
                    dispatched = _Dispatch(out, snapshot, k, context, rounds, self._prefilled)
                    self._prefilled = False
                if inflight:
                    events, finished = self._process(inflight)
                    yield from events
                    self._remove(shards, [r for r in finished if r.slot >= 0])
                # once every request of a dispatched step has finished its outputs are empty
                inflight = dispatched if any(shards) else None
            finished_normally = True
        finally:
            try:
                self.stats.end_run(requests)
                end = getattr(self.controller, "end_run", None)  # its dispatch left unobserved
                if end is not None:
                    end()
                if not finished_normally:
                    # an error or an abandoned stream: free every slot so no stale request
                    # keeps decoding in the next run, and drop the controller's rows of the
                    # unfinished requests (their ids never come back: kept, they piled up)
                    self.state = self._freed_state()
                    self._forget([r for r in requests if r.finish_reason is None], finished=False)
                else:  # what the slots retained holds until the state is written elsewhere
                    self._retained_at = self._state_writes
            finally:  # the last thing: the next run finds the slots freed
                self._run_lock.release()
