"""In-process profiler: measured step latency ITL(context, B, K) and draft acceptance.

    from dsd_jax.profiler import profile_engine
    prof = profile_engine(engine, context_lengths=(128, 512), prompts=token_id_lists)
    prof.save("profile.json")          # then SpecConfig(dynamic=DynamicConfig(profile=...))

Latency: for every batch bucket B of the engine, every K in 0..max_k and every
context length, the engine's own compiled (K, B) step program is run on a synthetic
device state (B live slots holding that many random committed tokens, draft cache
caught up) and timed with `jax.block_until_ready`: `warmup_reps` untimed calls, then
`repeats` timed calls, the whole table `passes` times over; a cell is K = 0's median
and, for K > 0, the median of each rep's ratio to its K = 0 call times that
(`paired_cells`). A call is one dispatch of `rounds_per_sample`
rounds, divided by the rounds it ran: the engine runs several rounds per dispatch while
its K is stable, so a one-round sample would charge every step the whole dispatch
overhead (about 0.3 ms here: 4% of a 7 ms B=1 step, which made K=0 look worse against
K>0 than it is). The Ks of one (context, B) are timed in turn,
rep by rep, so a slow stretch of the machine falls on all of them alike: the
controller compares Ks at one batch size, so their differences matter most. A step
with more drafts or more rows does a superset of the work, so the cells are then
fitted to the closest table (least squares) that is non-decreasing in K and in B,
which removes noise inversions such as K=6 timing below K=5; the raw cells are
kept in ``meta["latency_ms_raw"]``. The step program donates and advances the state,
so a small donated reset program (not timed) puts `length`/`active`/the drafter's state back
before every call: each rep runs at exactly the same context. The profiler borrows
the engine's state buffers for this (no second KV cache is allocated) and leaves the
engine idle (no live slots) afterwards, so do not call it while a `generate` is in
progress.

Acceptance: the engine generates from `prompts` with K = max_k at every step (a
recording controller is swapped in, then the engine's own is restored), and
``a_i = P(num_accepted >= i)`` is counted over every (step, live row), for each
temperature in `temperatures`.

Fingerprints: `model_fingerprint` hashes a model's config and parameters; a profile
loaded with ``Profile.load(path, expect_fingerprints=engine.fingerprints(),
expect_device_kind=jax.devices()[0].device_kind)`` warns loudly when it was measured
for other weights or another device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import statistics
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from dsd_jax.buckets import serving_buckets
from dsd_jax.inputs import encode_text
from dsd_jax.profile import Profile, check_nonincreasing
from dsd_jax.sampling import SamplingParams
from dsd_jax.step import MAX_ROUNDS, unpack_rounds

__all__ = ["profile_engine", "model_fingerprint", "engine_fingerprints", "device_kind",
           "format_profile", "monotone_latency", "paired_cells", "profile_latency", "SERVE_MARGIN"]


# --------------------------------------------------------------------------- monotone fit

def _isotonic(y: np.ndarray) -> np.ndarray:
    """Pool adjacent violators: the non-decreasing sequence closest to y (least squares)."""
    sums, counts = [], []
    for v in y:
        sums.append(float(v))
        counts.append(1)
        while len(sums) > 1 and sums[-2] / counts[-2] > sums[-1] / counts[-1]:
            s, c = sums.pop(), counts.pop()
            sums[-1] += s
            counts[-1] += c
    return np.concatenate([np.full(c, s / c) for s, c in zip(sums, counts)])


def paired_cells(samples: np.ndarray) -> np.ndarray:
    """Cells from samples[..., rep, K] (K = 0 first): K = 0's median, and each K's median
    ratio to the K = 0 sample of its own rep times that. The controller compares Ks at
    one batch size, and a rep's Ks ran back to back, so the ratio of a pair cancels the
    machine's slower and faster stretches that separate medians keep: on the built-in
    pair (`benchmarks/results/profile_rounds/`) the spread of K/K0 between profiles fell
    from 2-5% to 2-3.7% in one pass, and to 1.3-2.3% over two passes. NaN samples (reps
    not timed) are left out."""
    samples = np.asarray(samples, dtype=float)
    k0 = np.nanmedian(samples[..., :1], axis=-2)
    ratios = np.nanmedian(samples[..., 1:] / samples[..., :1], axis=-2)
    return np.concatenate([k0, k0 * ratios], axis=-1)


def monotone_latency(table: np.ndarray, rounds: int = 20) -> np.ndarray:
    """A [context, B, K] latency table made non-decreasing along K and along B.

    Alternating isotonic fits along each axis converge to a table close to the
    measurements; a final running max along K, then along B, makes both orders exact
    (a running max over B of rows that are each non-decreasing in K stays so).
    """
    t = np.array(table, dtype=float)
    for _ in range(rounds):
        if np.all(np.diff(t, axis=2) >= 0) and np.all(np.diff(t, axis=1) >= 0):
            break
        t = np.apply_along_axis(_isotonic, 2, t)
        t = np.apply_along_axis(_isotonic, 1, t)
    return np.maximum.accumulate(np.maximum.accumulate(t, axis=2), axis=1)


# A bucket's row is left out of the fit along B when a larger bucket is this much faster at
# every cell (`buckets.serving_buckets`): the noise between repeated profiles is 1.3-3.7%
# (`paired_cells`), the one-row penalty on the H200 36-50%.
SERVE_MARGIN = 0.05


def profile_latency(table: np.ndarray, batch_sizes: Sequence[int]) -> np.ndarray:
    """The latency table a profile stores: `monotone_latency`, except that a bucket a larger
    one beats by more than SERVE_MARGIN at every cell keeps its own (K-monotone) row. Fit
    along B, a one-row bucket slower than the two-row one (an H200's) would be pooled with
    it and hide that the controller should serve one row in the two-row program."""
    t = np.array(table, dtype=float)
    served = serving_buckets(t, batch_sizes, margin=SERVE_MARGIN)
    rows = [i for i, b in enumerate(batch_sizes) if b in served]
    keep = [i for i, b in enumerate(batch_sizes) if b not in served]
    t[:, keep] = monotone_latency(t[:, keep])
    if rows:
        own = np.apply_along_axis(_isotonic, 2, t[:, rows])
        t[:, rows] = np.maximum.accumulate(own, axis=2)
    return t


# --------------------------------------------------------------------------- fingerprints

def _config_dict(config: Any) -> Any:
    if hasattr(config, "to_dict"):
        return config.to_dict()
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise ValueError(f"cannot fingerprint a model config of type {type(config).__name__}")


def model_fingerprint(model_or_config_params) -> str:
    """Stable fingerprint of a model: ``"<config hash>.<params hash>"`` (16 hex digits each).

    Accepts a `dsd_jax.models.Transformer` (any NNX module with a ``config``) or a
    ``(config, params)`` pair, where params is an `nnx.State` or a nested dict of arrays
    (e.g. the state from `nnx.split`). The config part is the SHA-256 of the config dict
    as canonical JSON; the params part is the SHA-256 over every leaf in path order
    (its path, dtype, shape and raw bytes). Two fingerprints with equal first halves are
    the same architecture with different weights. Costs one device-to-host copy of the
    weights (leaf by leaf).
    """
    if isinstance(model_or_config_params, tuple) and len(model_or_config_params) == 2:
        config, params = model_or_config_params
    elif isinstance(model_or_config_params, nnx.Module):
        config, params = getattr(model_or_config_params, "config", None), nnx.state(model_or_config_params)
        if config is None:
            raise ValueError("model_fingerprint needs a model with a .config (or a (config, params) pair)")
    else:
        raise ValueError("model_fingerprint expects a model or a (config, params) pair, got "
                         f"{type(model_or_config_params).__name__}")
    cfg_json = json.dumps(_config_dict(config), sort_keys=True, separators=(",", ":"), default=str)
    cfg_hash = hashlib.sha256(cfg_json.encode()).hexdigest()[:16]
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    h = hashlib.sha256()
    for path, leaf in sorted(leaves, key=lambda pl: jax.tree_util.keystr(pl[0])):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            # a weight split over processes ("model" across them): every process calls this
            # in the same order (the engine's construction), so the gather is collective
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        arr = np.asarray(jax.device_get(leaf))
        h.update(jax.tree_util.keystr(path).encode())
        h.update(f"|{arr.dtype.name}|{arr.shape}|".encode())
        h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))  # its bytes, not a copy of them
    return f"{cfg_hash}.{h.hexdigest()[:16]}"


def engine_fingerprints(engine) -> dict[str, str]:
    """``{"target": ..., "draft": ...}`` (draft only with a draft model) for an engine."""
    out = {"target": model_fingerprint((engine.target_config, engine._target_params))}
    if engine.draft_config is not None and engine._draft_params is not None:
        out["draft"] = model_fingerprint((engine.draft_config, engine._draft_params))
    return out


def device_kind(device=None) -> str:
    """`device`'s kind (an engine's: `engine.placement.device`), else the first device's."""
    return (device or jax.devices()[0]).device_kind


# --------------------------------------------------------------------------- latency

def _reset(drafter, per_shard, state, batch, context, lag):
    """Rows < batch of every data shard (`per_shard` slots each) live at `context`
    committed tokens, the drafter caught up but for the last `lag`; others idle."""
    n = state.length.shape[0]
    live = jnp.arange(n) % per_shard < batch
    big = jnp.int32(state.capacity)  # never reaches its limit while profiling
    length = jnp.where(live, context, 0).astype(jnp.int32)
    return state._replace(
        length=length,
        drafter=drafter.admit(state.drafter, jnp.arange(n), jnp.maximum(length - lag, 0)),
        limit=jnp.where(live, big, 0).astype(jnp.int32),
        active=live,
    )


def _measure_catchup(engine, programs, state, context: int, repeats: int, warmup_reps: int,
                     buckets: Sequence[int]):
    """(state, {"chunk": C, "ms": [per batch size of `buckets`]} or None): what one round of the
    drafter's catch-up adds to a K = 1 step, C tokens a row behind against none, timed
    interleaved per bucket (a step after K = 0 steps catches up what they committed:
    what a switch from K = 0 costs on top of the step; `dsd-jax profile` shows it). None
    for drafters that never lag (no `catchup_chunk`), without K = 1, or at a context
    shorter than C + 2."""
    chunk = getattr(engine.drafter, "catchup_chunk", None)
    if not chunk or engine.max_k < 1 or context < chunk + 2:
        return state, None
    ms = []
    for b in buckets:
        step = engine.programs.step(1, b)
        times: dict[int, list[float]] = {0: [], chunk: []}
        for rep in range(warmup_reps + repeats):
            for lag in times:
                state, t = _time_step(engine, programs, step, state, b, context, lag, 1)
                if rep >= warmup_reps:
                    times[lag].append(t)
        ms.append(max(0.0, (statistics.median(times[chunk]) - statistics.median(times[0])) * 1e3))
    return state, {"chunk": int(chunk), "ms": ms}


def _timing_order(engine, batch_sizes: Sequence[int] | None) -> list[int]:
    """The batch buckets `profile_engine` times, in the order given (default: all, ascending)."""
    if batch_sizes is None:
        return list(engine.batch_buckets)
    order = [int(b) for b in batch_sizes]
    unknown = sorted(set(order) - set(engine.batch_buckets))
    if not order or unknown or len(set(order)) != len(order):
        raise ValueError(f"batch_sizes must be distinct batch buckets of the engine "
                         f"{list(engine.batch_buckets)}, got {list(batch_sizes)}")
    return order


def _sample_start(engine, context: int, k: int, rounds: int) -> int:
    """The context a sample of `rounds` rounds of K = k starts at: `context`, or where a
    context near max_seq_len would run out of cache room within the sample, just early
    enough that every round fits (rows ending early would share the dispatch overhead
    among fewer rounds at K > 0 than at K = 0: up to 21 positions early at K = 6, 4 rounds)."""
    return max(1, min(context, engine.capacity - rounds * (k + 1)))


def _time_step(engine, programs, step, state, batch: int, context: int, lag: int, rounds: int):
    """(state, seconds a round) of one call of the step program `step` asking for `rounds`
    rounds, from `batch` rows live at `context` (the drafter `lag` tokens behind)."""
    state = programs.reset(state, np.int32(batch), np.int32(context), np.int32(lag))
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state, out = step(engine._target_params, engine._draft_params, state, np.int32(rounds))
    jax.block_until_ready((state, out))
    elapsed = time.perf_counter() - t0
    return state, elapsed / max(unpack_rounds(np.asarray(out))[1], 1)


def _fill(state, key, vocab, temperature):
    """Random committed tokens everywhere; greedy or sampling rows; no stop ids, bias, bad words,
    allow-lists or penalties."""
    return state._replace(
        tokens=jax.random.randint(key, state.tokens.shape, 0, vocab, jnp.int32),
        temperature=jnp.full_like(state.temperature, temperature),
        top_k=jnp.zeros_like(state.top_k),
        top_p=jnp.ones_like(state.top_p),
        min_p=jnp.zeros_like(state.min_p),
        repetition_penalty=jnp.ones_like(state.repetition_penalty),
        presence_penalty=jnp.zeros_like(state.presence_penalty),
        frequency_penalty=jnp.zeros_like(state.frequency_penalty),
        bias_ids=jnp.full_like(state.bias_ids, -1),
        bad_words=jnp.full_like(state.bad_words, -1),
        allowed_ids=jnp.full_like(state.allowed_ids, -1),
        seed=jnp.arange(state.seed.shape[0], dtype=jnp.uint32),
        stop_ids=jnp.full_like(state.stop_ids, -1),
    )


def _idle(drafter, per_shard, state):
    return _reset(drafter, per_shard, state, 0, 0, 0)


class _StatePrograms(NamedTuple):
    fill: Callable
    reset: Callable
    idle: Callable


def _state_programs(engine) -> _StatePrograms:
    """The profiler's small state programs for `engine`, keeping the state in the engine's
    layout (on a mesh, the step programs accept no other)."""
    outs = engine.placement.state_shardings(engine.state)
    kw = {} if outs is None else {"out_shardings": outs}
    return _StatePrograms(
        jax.jit(_fill, donate_argnums=0, static_argnums=2, **kw),
        jax.jit(functools.partial(_reset, engine.drafter, engine.slots_per_shard), donate_argnums=0,
                **kw),
        jax.jit(functools.partial(_idle, engine.drafter, engine.slots_per_shard), donate_argnums=0,
                **kw))


class _Held:
    """The engine's state while a measurement borrows it (`state`: the latest, since every
    step program donates the one it is given)."""

    def __init__(self, state):
        self.state = state


@contextlib.contextmanager
def _borrowed_state(engine, programs: "_StatePrograms", seed: int, temperature: float):
    """Lends the engine's state to timed steps, filled with random committed tokens (greedy
    rows at temperature 0), and gives it back idle; a call that failed midway (its donated
    buffers deleted) leaves the engine a fresh state instead."""
    held = _Held(None)
    state, engine.state = engine.state, None
    try:
        held.state = programs.fill(state, jax.random.PRNGKey(seed), engine.target_config.vocab_size,
                                   float(temperature))
        yield held
    finally:
        if held.state is not None and _state_usable(held.state):
            engine.state = programs.idle(held.state)
        else:
            engine.state = engine.new_state()


def time_steps(engine, steps: dict, batch: int, context: int, repeats: int = 7, warmup_reps: int = 2,
               rounds: int = 4, seed: int = 0) -> dict:
    """Milliseconds a round of each of `steps` (name -> a program with the signature of
    `engine.programs.step(k, b)`: the engine's, or `step_with_drafter`'s), `batch` greedy rows
    live at `context`, on the engine's own state: `repeats` timed calls each, interleaved
    (rep after rep, every program once), after `warmup_reps` untimed ones.
    Returns {name: [ms, ...]}, the reps in order, so differences can be paired."""
    engine._check_idle("time_steps", "timing runs on the device state holding the stream's requests")
    programs = _state_programs(engine)
    out = {name: [] for name in steps}
    with _borrowed_state(engine, programs, seed, 0.0) as held:
        for rep in range(int(warmup_reps) + int(repeats)):
            for name, step in steps.items():
                held.state, t = _time_step(engine, programs, step, held.state, batch, context, 0, rounds)
                if rep >= warmup_reps:
                    out[name].append(t * 1e3)
    return out


def _state_usable(state) -> bool:
    return not any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state))


# --------------------------------------------------------------------------- acceptance

class _AcceptanceRecorder:
    """Controller stand-in: always K = max_k; counts P(num_accepted >= i)."""

    def __init__(self, max_k: int):
        self.max_k = max_k
        self.rows = 0
        self.hits = np.zeros(max_k, np.int64)  # rows with num_accepted >= i, i = 1..max_k
        self.steps = 0

    def choose_k(self, batch_size, context_len=None, request_ids=None):
        return self.max_k

    def observe(self, k, num_accepted, step_time_s=None, request_ids=None, **kw):
        if k != self.max_k:
            return
        acc = np.asarray(num_accepted, np.int64).reshape(-1)
        self.steps += 1
        self.rows += acc.size
        self.hits += (acc[:, None] >= np.arange(1, self.max_k + 1)).sum(0)

    def acceptance(self) -> list[float]:
        if self.rows == 0:
            raise RuntimeError("the acceptance run observed no speculative step")
        return (self.hits / self.rows).tolist()


def _random_prompts(vocab: int, n: int = 8, length: int = 16, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=length).tolist() for _ in range(n)]


def _measure_acceptance(engine, prompts, temperature: float, max_tokens: int,
                        seed: int = 0) -> tuple[list[float], int]:
    rec = _AcceptanceRecorder(engine.max_k)
    with engine._stand_in(rec):
        params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=(seed + i) % 2 ** 32,
                                 ignore_eos=True) for i in range(len(prompts))]
        engine.generate(prompts, params)
    return rec.acceptance(), rec.rows


def _prepare_prompts(engine, prompts, max_tokens: int) -> list:
    out = []
    keep = engine.max_seq_len - max(1, min(max_tokens, engine.max_seq_len // 2))
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if engine.tokenizer is None:
                raise ValueError("string prompts need an engine with a tokenizer (or pass token-id lists)")
            p = encode_text(engine.tokenizer, p)
        p = [int(t) for t in p]
        if not p:
            raise ValueError(f"prompt {i} is empty")
        out.append(p[-keep:])
    return out


# --------------------------------------------------------------------------- profile_engine

def profile_engine(engine, *, context_lengths: Sequence[int] = (128,), repeats: int = 7,
                   warmup_reps: int = 2, passes: int = 2, rounds_per_sample: int = 4, prompts: Sequence | None = None,
                   acceptance_max_tokens: int = 64, temperatures: Sequence[float] = (0.0,),
                   progress: Callable[[int, int], None] | None = None,
                   latency_temperature: float = 0.0, seed: int = 0,
                   acceptance: Sequence[float] | None = None,
                   batch_sizes: Sequence[int] | None = None,
                   deadline: float | None = None) -> Profile:
    """Profiles `engine` (a `SpecEngine`) and returns a `Profile` (not saved).

    context_lengths: committed tokens per slot in the latency runs (each in
        1..engine.max_seq_len; sorted and de-duplicated).
    repeats / warmup_reps: timed and untimed calls per (context, B, K) cell and pass,
        in milliseconds: K = 0's cell is the median of its calls, a K > 0 cell that
        times the median ratio of its calls to the K = 0 call of the same rep
        (`paired_cells`).
    passes: times the whole table over (passes x repeats timed calls a cell, spread
        over the profile's time, so a slow stretch of the machine hits one pass).
    rounds_per_sample: rounds per timed call (1..MAX_ROUNDS), the call's time divided
        by the rounds it ran; rows run from their context length onwards.
    prompts: token-id lists (or strings, with a tokenizer) for the acceptance runs;
        None uses 8 random 16-token prompts (only meaningful for random models: pass
        prompts representative of your workload). Each prompt keeps its last tokens
        if it would not fit in max_seq_len with room to generate.
    acceptance_max_tokens: tokens generated per prompt in the acceptance runs.
    temperatures: one acceptance run each; the first fills ``acceptance``.
    progress: ``progress(done, total)`` after each latency cell and each acceptance run.
    latency_temperature: sampling temperature of the synthetic rows (0 = greedy; > 0
        also times the noise generation of sampling).
    seed: seeds the synthetic rows, the random prompts and the sampled acceptance runs
        (prompt i's request: seed + i).
    acceptance: a_1..a_max_k to record instead of measuring them (e.g. a published
        per-position curve, for models with random weights): the acceptance runs are
        skipped and `prompts`/`temperatures` are not used.
    batch_sizes: the engine's batch buckets to time (default: all of them), in the order
        they are timed within a pass; the profile lists them sorted.
    deadline: a `time.perf_counter()` value after which no further (pass, batch size)
        row of the latency table starts (the first row always runs): the profile then
        holds the batch sizes reached, from the passes that reached them, and its meta
        says what was cut (``meta["truncated"]``). The acceptance runs, when measured,
        and the catch-up timing are not cut.

    With a drafter that lags after K = 0 steps (the draft model, EAGLE-3), the profile
    also holds what one round of its catch-up adds to a step per bucket (`catchup_ms`,
    at the largest context length; `_measure_catchup`).
    """
    engine._check_idle("profile_engine", "profiling runs on the device state holding the stream's requests")
    context_lengths = sorted({int(c) for c in context_lengths})
    if not context_lengths:
        raise ValueError("context_lengths must not be empty")
    if context_lengths[0] < 1 or context_lengths[-1] > engine.max_seq_len:
        raise ValueError(f"context lengths must be in 1..max_seq_len={engine.max_seq_len}, got "
                         f"{context_lengths}")
    if int(repeats) < 1 or int(warmup_reps) < 0 or int(passes) < 1:
        raise ValueError(f"need repeats >= 1, warmup_reps >= 0 and passes >= 1, got {repeats}, "
                         f"{warmup_reps}, {passes}")
    if int(acceptance_max_tokens) < 1:
        raise ValueError(f"acceptance_max_tokens must be >= 1, got {acceptance_max_tokens}")
    if not 1 <= int(rounds_per_sample) <= MAX_ROUNDS:
        raise ValueError(f"rounds_per_sample must be in 1..{MAX_ROUNDS}, got {rounds_per_sample}")
    rounds = int(rounds_per_sample)
    temperatures = [float(t) for t in temperatures]
    if not temperatures or any(not (t >= 0.0) or t != t for t in temperatures):
        raise ValueError(f"temperatures must be a non-empty list of numbers >= 0, got {temperatures}")
    if acceptance is not None:
        acceptance = [float(a) for a in acceptance]
        if len(acceptance) < engine.max_k or not all(0.0 <= a <= 1.0 for a in acceptance):
            raise ValueError(f"acceptance must give a_1..a_{engine.max_k} (max_k), each in [0, 1], "
                             f"got {acceptance}")
        check_nonincreasing("acceptance", acceptance)  # the whole curve given, not only a_1..a_max_k
        acceptance = acceptance[:engine.max_k]
    order = _timing_order(engine, batch_sizes)
    ks = list(range(engine.max_k + 1))
    do_acceptance = engine.max_k > 0 and acceptance is None
    total = (int(passes) * len(context_lengths) * len(order) * len(ks)
             + (len(temperatures) if do_acceptance else 0))
    done = 0
    t_start = time.perf_counter()

    # (a) latency on a synthetic state (the engine's own buffers, borrowed).
    reps, warm = int(repeats), int(warmup_reps)
    # NaN: not timed (a row the deadline cut)
    samples = np.full((len(context_lengths), len(order), int(passes) * reps, len(ks)), np.nan)
    timed = np.zeros((int(passes), len(order)), bool)  # every context of the row done
    programs = _state_programs(engine)
    with _borrowed_state(engine, programs, seed, latency_temperature) as held:
        for pass_, bi in itertools.product(range(int(passes)), range(len(order))):
            if deadline is not None and (pass_, bi) != (0, 0) and time.perf_counter() > deadline:
                break
            b = order[bi]
            steps = [engine.programs.step(k, b) for k in ks]  # compiles on first use
            for ci, ctx in enumerate(context_lengths):
                for rep in range(warm + reps):
                    for k in ks:  # interleaved: drift hits every K of this row alike
                        start = _sample_start(engine, ctx, k, rounds)
                        held.state, t = _time_step(engine, programs, steps[k], held.state, b, start, 0,
                                                   rounds)
                        if rep >= warm:
                            samples[ci, bi, pass_ * reps + rep - warm, k] = t * 1e3
                for _ in ks:
                    done += 1
                    if progress:
                        progress(done, total)
            timed[pass_, bi] = True
        keep = [bi for bi in np.argsort(order) if timed[:, bi].any()]  # sorted by batch size
        buckets = [order[bi] for bi in keep]
        truncated = None if timed.all() else {
            "dropped_batch_sizes": sorted(order[bi] for bi in range(len(order)) if bi not in keep),
            "passes_timed": {str(order[bi]): int(timed[:, bi].sum()) for bi in keep}}
        table = paired_cells(samples[:, keep])
        held.state, catchup = _measure_catchup(engine, programs, held.state, context_lengths[-1],
                                               reps, warm, buckets)
    latency_s = time.perf_counter() - t_start

    # (b) acceptance with K = max_k at every step (unless given).
    by_temp: dict[str, list[float]] | None = None
    rows_observed: dict[str, int] = {}
    prompt_source = "given"
    if acceptance is not None:
        prompt_source, prompts = "none (acceptance given)", []
    elif prompts is None:
        prompt_source = "random"
        prompts = _random_prompts(engine.target_config.vocab_size, seed=seed)
    t_acc = time.perf_counter()
    if do_acceptance:
        prompts = _prepare_prompts(engine, prompts, int(acceptance_max_tokens))
        if not prompts:
            raise ValueError("prompts must not be empty")
        by_temp = {}
        for t in temperatures:
            a, rows = _measure_acceptance(engine, prompts, t, int(acceptance_max_tokens), seed)
            by_temp[str(t)] = a
            rows_observed[str(t)] = rows
            done += 1
            if progress:
                progress(done, total)
        acceptance = by_temp[str(temperatures[0])]
    elif acceptance is None:
        acceptance = []
    acceptance_s = time.perf_counter() - t_acc

    return Profile(
        device_kind=device_kind(engine.placement.device),
        platform=engine.placement.device.platform,
        jax_version=jax.__version__,
        method=engine.spec.method,
        fingerprints=engine_fingerprints(engine),
        batch_sizes=buckets,
        ks=ks,
        context_lengths=context_lengths,
        latency_ms=profile_latency(table, buckets).tolist(),
        acceptance=acceptance,
        acceptance_by_temperature=by_temp,
        catchup_ms=catchup,
        meta={
            "context_lengths": context_lengths,
            "repeats": int(repeats),
            "passes": int(passes),
            "cells": "K=0 median; K>0: K=0 median x median ratio to the same rep's K=0",
            "rounds_per_sample": int(rounds_per_sample),
            "warmup_reps": int(warmup_reps),
            "latency_ms_raw": table.tolist(),
            "latency_temperature": float(latency_temperature),
            "num_prompts": len(prompts),
            "prompt_source": prompt_source,
            "acceptance_max_tokens": int(acceptance_max_tokens),
            "acceptance_rows_observed": rows_observed,
            "engine": {
                "max_batch_size": engine.max_batch_size,
                "max_seq_len": engine.max_seq_len,
                "capacity": engine.capacity,
                "mesh": dict(engine.placement.sizes),
                "batch_buckets": list(engine.batch_buckets),
                "kernel_backends": dict(engine.kernel_backends),  # what the steps timed ran
                "spec": engine.spec.to_dict(),
            },
            "profiler_seconds": {"latency": round(latency_s, 3), "acceptance": round(acceptance_s, 3)},
            **({} if truncated is None else {"truncated": truncated}),
        },
    )


def format_profile(prof: Profile) -> str:
    """A human-readable table of the profile (ms per step; AL and goodput per K)."""
    lines = [f"device {prof.device_kind} ({prof.platform}), jax {prof.jax_version}, method {prof.method}"]
    if prof.acceptance:
        lines.append("acceptance a_i = P(accepted >= i): " + " ".join(f"{a:.3f}" for a in prof.acceptance))
        for t, a in (prof.acceptance_by_temperature or {}).items():
            lines.append(f"  temperature {t}: " + " ".join(f"{x:.3f}" for x in a))
    if prof.catchup_ms is not None:
        lines.append(f"draft catch-up, one {prof.catchup_ms['chunk']}-token round a row: "
                     + "  ".join(f"B={b} {ms:.2f} ms" for b, ms in zip(prof.batch_sizes, prof.catchup_ms["ms"])))
    al = np.concatenate([[1.0], 1.0 + np.cumsum(prof.acceptance)])
    head = "   B | " + " ".join(f"K={k:<7d}" for k in prof.ks) + " | best K (goodput tok/s/row)"
    for ci, ctx in enumerate(prof.context_lengths):
        lines.append(f"context {ctx}: step latency ms")
        lines.append(head)
        for bi, b in enumerate(prof.batch_sizes):
            row = prof.latency_ms[ci][bi]
            good = al / np.asarray(row) * 1e3
            best = int(np.argmax(good))
            lines.append(f"{b:4d} | " + " ".join(f"{x:<9.3f}" for x in row)
                         + f" | {best} ({good[best]:.0f})")
    for b, c in serving_buckets(prof.latency_ms, prof.batch_sizes).items():
        lines.append(f"batch bucket {b} is slower than bucket {c} at every context and K: an "
                     f"engine that compiled both runs the batches bucket {b} would hold in bucket {c}")
    return "\n".join(lines)
