"""Validate and time everything on one accelerator: `python benchmarks/device_check.py --out DIR`.

Four sections, each writing into DIR/device_check.json (rewritten after every section, so a
run cut short keeps what it finished) and DIR/device_check.txt (the report):

- ``kernels``: the Pallas kernels (backend "pallas", not interpret) against their XLA
  references on the same device, with the cases and tolerances of `tests/test_kernels.py`
  (attention: max relative error < 1e-5 f32 / 1e-2 bf16, NaN exactly where the reference
  has it; rejection sampling: identical tokens and counts).
- ``timings``: each kernel against XLA at the Llama-3.1-8B, Qwen2.5-7B and Qwen3-8B shapes,
  with the roofline of `kernels/ROOFLINE.md` beside it (bytes, FLOPs, floor time at the
  device's HBM bandwidth, achieved GB/s and the fraction of the floor).
- ``e2e``: the engine on the built-in pair and on a synthetic real-shape pair
  (`models.synthetic`), greedy and sampled, with the XLA backend and the Pallas one: the
  tokens must be identical.
- ``profile``: the ITL(B, K) profile of the synthetic pair (`profile_engine`, backend
  "auto" with its per-kernel fallback), the acceptance given (the vLLM dynamic-SD PR's
  a_i), and the K schedule the goodput rule derives from it, beside the PR's H100 one.

``--time-budget S`` keeps the whole run within about S seconds, so that one call of a lent
machine's limited time always returns a report: a section, or an item inside one (a kernel
case, a timing point, an e2e pair, a profile row), starts only while its share of the time is
left; what was cut says "skipped (time budget)". Each section may use a share of the time
left when it starts (`SECTION_WEIGHTS`): the kernel checks all of it, then timings, e2e and
the profile 3 : 3 : 4 (time a section leaves unused passes to the next). The profile compiles
and times its batch sizes in the order given (`Settings.profile_buckets`), so a cut profile
keeps the first ones. A run may overshoot S by its longest item: an e2e pair, or the programs
being compiled when time ran out.

``--cpu-smoke`` runs the same code on tiny shapes in interpret mode on the CPU (the test
suite runs it). Everything is in small functions so the tests and other tools can call
each piece.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import platform as _platform
import statistics
import sys
import time
import traceback
import zlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dsd_jax import kernels
from dsd_jax.kernels import attention_pallas, rejection_pallas
from dsd_jax.kernels.attention_ref import verify_attention_xla
from dsd_jax.kernels.rejection_ref import rejection_sample_xla

SECTIONS = ("kernels", "timings", "e2e", "profile")
F32, BF16 = jnp.float32, jnp.bfloat16
TOL = {"float32": 1e-5, "bfloat16": 1e-2}

# Acceptance a_i = P(accepted >= i) published with vLLM's dynamic speculative decoding PR,
# and the K schedule that PR profiled on an H100 (for the report's comparison).
VLLM_ACCEPTANCE = (0.681, 0.391, 0.204, 0.101, 0.051)
VLLM_H100_SCHEDULE = "K*=3 up to B~16-64, K*=1 around B~64-128, K*=0 at B=256"

# Peak HBM bandwidth (bytes/s) and dense bf16 FLOP/s by device kind (ROOFLINE.md numbers).
_HARDWARE = (("H200", 4.8e12, 990e12), ("H100 PCIe", 2.0e12, 756e12), ("H100", 3.35e12, 990e12),
             ("A100", 2.0e12, 312e12))

# Shares of the time left under --time-budget that a section may use when it starts, among
# the sections still to run (None: all of it; the kernel checks come first and are short).
SECTION_WEIGHTS = {"kernels": None, "timings": 3, "e2e": 3, "profile": 4}
PROFILE_COMPILE_SHARE = 0.6  # of the profile's time, at most, for compiling its step programs
# seconds the profile keeps after its last row: the pair's fingerprints (a hash of every
# weight, ~18 s for 8B + 1B), the draft's catch-up timing and the file
PROFILE_RESERVE_S = 40.0

# Correctness cases: the GPU cases of tests/test_kernels.py (tests/test_device_check.py keeps
# them equal). (B, T, Hq, Hkv, S, D, dtype, block_k, num_splits, row kinds)
ATTN_CASES = [
    (3, 1, 4, 4, 40, 64, "float32", None, None, ("one", "full", "odd")),
    (4, 5, 28, 4, 200, 128, "float32", 64, 3, ("odd", "one", "full", "pad")),
    (3, 9, 16, 2, 77, 128, "bfloat16", 32, 2, ("full", "odd", "neg")),
    (3, 3, 8, 4, 50, 64, "bfloat16", 16, None, ("pad", "one", "odd")),
    (2, 2, 32, 8, 129, 64, "float32", 32, 4, ("odd", "full")),
]
# (B, K, V, one-hot q, greedy rows, p == q rows, block_v, GPU splits)
REJ_CASES = [
    (6, 4, 1000, False, (1,), (2,), 256, 3),
    (6, 3, 700, True, (0, 4), (), 128, 2),
    (3, 8, 520, False, (), (1,), 128, None),
    (2, 1, 151936, False, (1,), (), None, None),
]
# name: (Hq, Hkv, head_dim, vocab), as in tests/test_kernels.py
TIMING_MODELS = {
    "llama-3.1-8b": (32, 8, 128, 128256),
    "qwen2.5-7b": (28, 4, 128, 152064),
    "qwen3-8b": (32, 8, 128, 151936),
}


@dataclasses.dataclass
class Settings:
    """What a run covers; `gpu()` is the real run, `cpu_smoke()` the tiny interpret one."""

    backend: str = "pallas"  # the Pallas backend checked against "xla"
    attn_cases: Sequence = tuple(ATTN_CASES)
    rej_cases: Sequence = tuple(REJ_CASES)
    timing_models: dict = dataclasses.field(default_factory=lambda: dict(TIMING_MODELS))
    # (B, T, live L) per model; the first model gets `attn_points`, the others `attn_points_short`
    attn_points: Sequence = ((1, 5, 2048), (8, 1, 2048), (8, 5, 2048), (8, 5, 512), (32, 5, 4096),
                             (64, 5, 2048))
    attn_points_short: Sequence = ((1, 5, 2048), (8, 5, 2048), (64, 5, 2048))
    # (B, K, one-hot q)
    rej_points: Sequence = ((1, 4, False), (8, 4, False), (8, 4, True), (64, 4, False), (64, 4, True))
    rej_points_short: Sequence = ((1, 4, False), (8, 4, False), (64, 4, False))
    timing_reps: int = 7
    chain: int = 10  # kernel calls per timed program (one dispatch amortised over them)
    dtype: str = "bfloat16"  # timings and the synthetic pairs
    builtin: bool = True  # e2e on the built-in pair too
    e2e_pair: tuple = ("llama-3.1-8b", "llama-3.2-1b")
    e2e_batch: int = 4
    e2e_prompt_len: int = 32
    e2e_max_tokens: int = 32
    e2e_k: int = 3
    profile_pair: tuple = ("llama-3.1-8b", "llama-3.2-1b")
    # the profile's batch buckets, in the order they are compiled and timed: a profile cut
    # by the time budget keeps the first (the ends of the range, then its middle)
    profile_buckets: Sequence = (1, 256, 64, 16, 128, 32)
    profile_contexts: Sequence = (128, 512)
    profile_max_k: int = 4
    profile_max_seq_len: int | None = None  # None: the longest context + 64
    compile_threads: int = 8  # step programs compiled in parallel before the profile
    profile_repeats: int = 5
    profile_warmup_reps: int = 2
    acceptance: Sequence = VLLM_ACCEPTANCE

    @classmethod
    def gpu(cls, **kw) -> "Settings":
        return cls(**kw)

    @classmethod
    def cpu_smoke(cls, **kw) -> "Settings":
        base = dict(
            backend="interpret", attn_cases=(ATTN_CASES[0], ATTN_CASES[2]),
            rej_cases=(REJ_CASES[1],), timing_models={"tiny-llama": (4, 2, 16, 512)},
            attn_points=((2, 3, 40),), attn_points_short=(), rej_points=((2, 2, False),),
            rej_points_short=(), timing_reps=2, chain=2, builtin=False,
            e2e_pair=("tiny-llama", "tiny-llama-draft"), e2e_batch=2, e2e_prompt_len=8,
            e2e_max_tokens=6, e2e_k=1, profile_pair=("tiny-llama", "tiny-llama-draft"),
            # the e2e XLA engine's shapes: its step program is the profile's (a compilation
            # cache, as the test suite has, compiles it once)
            profile_buckets=(2,), profile_contexts=(16,), profile_max_k=1, profile_max_seq_len=22,
            profile_repeats=1, profile_warmup_reps=0)
        return cls(**{**base, **kw})


# --------------------------------------------------------------------------- helpers

def device_info() -> dict:
    dev = jax.devices()[0]
    info = {"device_kind": dev.device_kind, "platform": dev.platform, "num_devices": jax.device_count(),
            "jax": jax.__version__, "python": _platform.python_version()}
    try:
        import flax
        info["flax"] = flax.__version__
    except Exception:  # noqa: BLE001
        pass
    peak = hardware_peaks(dev.device_kind)
    if peak:
        info["hbm_bytes_per_s"], info["bf16_flops_per_s"] = peak
    return info


def hardware_peaks(device_kind: str) -> tuple[float, float] | None:
    """(HBM bytes/s, dense bf16 FLOP/s) of a known device kind, else None."""
    for name, bw, flops in _HARDWARE:
        if name.lower() in device_kind.lower():
            return bw, flops
    return None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


SKIPPED = "time budget"


def _unless_expired(deadline: float | None, fn: Callable, *args, **kw) -> dict:
    """`_guard(fn, ...)`, or {"skipped": "time budget"} once `deadline` has passed."""
    return {"skipped": SKIPPED} if _expired(deadline) else _guard(fn, *args, **kw)


def _guard(fn: Callable, *args, **kw) -> dict:
    """fn(...) as a dict, or {"error": first line, "traceback": ...} when it raises."""
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001  (a device check reports, it does not stop)
        return {"error": _first_line(e), "traceback": traceback.format_exc(limit=8)}


def chained_calls(step: Callable) -> Callable:
    """`(x, consts, per_call) -> x`: `step(x, *consts, *extra)` for each `extra` in `per_call`, in turn."""
    def chained(x, consts, per_call):
        for extra in per_call:
            x = step(x, *consts, *extra)
        return x
    return chained


def time_chain(step: Callable, x, consts: Sequence, reps: int, chain: int,
               per_call: Sequence[tuple] | None = None) -> float:
    """Seconds per call of `step(x, *consts) -> x'` (x' like x): a jitted chain of `chain`
    dependent calls, the median of `reps` timed dispatches divided by `chain` (one dispatch's
    overhead is spread over the chain; each call waits on the one before). `x` is donated
    and threaded from dispatch to dispatch (a KV cache in it is updated in place).
    per_call: `chain` tuples of further arguments, call i getting the i-th
    (`step(x, *consts, *per_call[i])`): separate buffers where work that does not read x
    would otherwise be done once for the whole chain."""
    per_call = [()] * chain if per_call is None else list(per_call)
    if len(per_call) != chain:
        raise ValueError(f"per_call has {len(per_call)} entries for a chain of {chain}")
    f = jax.jit(chained_calls(step), donate_argnums=0)
    x = jax.block_until_ready(f(x, consts, per_call))  # compile + warm
    x = jax.block_until_ready(f(x, consts, per_call))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x = jax.block_until_ready(f(x, consts, per_call))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / chain


# --------------------------------------------------------------------------- kernels: correctness

def query_positions(rng, B, T, S, kinds):
    """Per-row query positions: kind "one" (length 1: first query at 0), "full" (last
    query at S-1), "odd" (random odd length), "pad" (trailing padding queries clamped
    to position 0, as the model does), "neg" (position -1: sees nothing -> NaN).
    tests/test_kernels.py uses it too."""
    rows = []
    for b in range(B):
        kind = kinds[b % len(kinds)]
        if kind == "neg":
            rows.append(np.full(T, -1))
            continue
        if kind == "one":
            start = 0
        elif kind == "full":
            start = S - T
        else:
            start = min(int(rng.integers(0, S - T + 1)) | 1, S - T)
        pos = start + np.arange(T)
        if kind == "pad" and T > 1:
            pos[T // 2 + 1:] = 0
        rows.append(pos)
    return jnp.asarray(np.stack(rows), jnp.int32)


def cache_rows(B, N):
    """A non-trivial row map: descending, stepping over rows, the first row repeated last
    (B > 2), e.g. B 3, N 5 -> [4, 2, 4]; B 4, N 6 -> [5, 3, 1, 5]."""
    rows = (N - 1 - 2 * np.arange(B)) % N
    if B > 2:
        rows[-1] = rows[0]
    return jnp.asarray(rows, jnp.int32)


def attention_case(case, backend: str) -> dict:
    """One attention case: the Pallas kernel against the XLA reference on this device."""
    B, T, Hq, Hkv, S, D, dtype, block_k, num_splits, kinds = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    N = B + 2
    dt = jnp.dtype(dtype)
    q = jnp.asarray(rng.standard_normal((B, T, Hq, D)), dt)
    k = jnp.asarray(rng.standard_normal((N, Hkv, S, D)), dt)
    v = jnp.asarray(rng.standard_normal((N, Hkv, S, D)), dt)
    pos, rows = query_positions(rng, B, T, S, kinds), cache_rows(B, N)
    with jax.default_matmul_precision("highest"):  # GPU XLA would use TF32 for f32 dots
        ref = np.asarray(jax.jit(verify_attention_xla)(q, k, v, pos, rows), np.float32)
    fn = functools.partial(attention_pallas.verify_attention, interpret=backend == "interpret",
                           platform="gpu" if backend == "interpret" else None, block_k=block_k,
                           num_splits=num_splits)
    out = np.asarray(jax.jit(fn)(q, k, v, pos, rows), np.float32)
    nan_ok = bool(np.array_equal(np.isnan(out), np.isnan(ref)))
    ok_mask = ~np.isnan(ref)
    err = float(np.max(np.abs(out[ok_mask] - ref[ok_mask])) / np.max(np.abs(ref[ok_mask])))
    tol = TOL[dtype]
    return {"case": f"B{B}-T{T}-Hq{Hq}-Hkv{Hkv}-S{S}-D{D}-{dtype}", "rel_err": err, "tol": tol,
            "nan_match": nan_ok, "ok": nan_ok and err < tol}


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def rejection_inputs(seed, B, K, V, *, one_hot_q=False, greedy_rows=(), equal_rows=()):
    """p close to q (so every acceptance count occurs), drafts sampled from q; some rows
    greedy (one-hot p, argmax drafts, mostly right) and some with p == q (no residual
    mass). tests/test_kernels.py uses it too."""
    rng = np.random.default_rng(seed)
    q = _softmax(2.0 * rng.standard_normal((B, K, V)))
    p = _softmax(np.log(np.concatenate([q, _softmax(rng.standard_normal((B, 1, V)))], 1))
                 + 0.7 * rng.standard_normal((B, K + 1, V)))
    d = np.array([[rng.choice(V, p=q[b, i] / q[b, i].sum()) for i in range(K)]
                  for b in range(B)], np.int32).reshape(B, K)
    for b in equal_rows:
        p[b, :K] = q[b]
    for b in greedy_rows:
        top = p[b].argmax(-1)
        p[b] = 0.0
        p[b, np.arange(K + 1), top] = 1.0
        d[b] = np.where(rng.random(K) < 0.7, top[:K], d[b])
    u = rng.random((B, K)).astype(np.float32)
    g = rng.gumbel(size=(B, K + 1, V)).astype(np.float32)
    return (jnp.asarray(p), None if one_hot_q else jnp.asarray(q), jnp.asarray(d),
            jnp.asarray(u), jnp.asarray(g))


def rejection_case(case, backend: str) -> dict:
    """One rejection-sampling case: Pallas tokens and counts equal to the XLA reference's."""
    B, K, V, one_hot_q, greedy, equal, block_v, splits = case
    args = rejection_inputs(B * 1000 + K * 10 + V, B, K, V, one_hot_q=one_hot_q,
                            greedy_rows=greedy, equal_rows=equal)
    n_ref, t_ref = jax.jit(rejection_sample_xla)(*args)
    fn = functools.partial(rejection_pallas.rejection_sample, interpret=backend == "interpret",
                           platform="gpu" if backend == "interpret" else None, block_v=block_v,
                           num_splits=splits)
    n, t = jax.jit(fn)(*args)
    same = bool(np.array_equal(np.asarray(n), np.asarray(n_ref))
                and np.array_equal(np.asarray(t), np.asarray(t_ref)))
    return {"case": f"B{B}-K{K}-V{V}{'-onehotq' if one_hot_q else ''}", "tokens_identical": same,
            "ok": same}


def check_kernels(s: Settings, deadline: float | None = None) -> dict:
    attn = [_unless_expired(deadline, attention_case, c, s.backend) for c in s.attn_cases]
    rej = [_unless_expired(deadline, rejection_case, c, s.backend) for c in s.rej_cases]
    rows = attn + rej
    skipped = sum("skipped" in r for r in rows)
    return {"backend": s.backend, "attention": attn, "rejection": rej,
            "passed": sum(bool(r.get("ok")) for r in rows), "total": len(rows) - skipped,
            "skipped": skipped}


# --------------------------------------------------------------------------- kernels: timings

def attention_roofline(B, T, Hq, Hkv, L, D, itemsize=2, splits=1, r_pad=None) -> dict:
    """ROOFLINE.md §1 byte and FLOP counts of one verify-attention call."""
    kv = B * Hkv * L * D * 2 * itemsize
    qo = B * T * Hq * D * 2 * itemsize
    r_pad = r_pad or T * (Hq // Hkv)
    partials = 0 if splits == 1 else 2 * B * Hkv * splits * r_pad * (D + 2) * 4
    # "ideal" as ROOFLINE.md: KV plus q/o with the XLA pack/unpack, no split-K partials
    return {"kv_bytes": kv, "qo_bytes": 2 * qo, "partial_bytes": partials,
            "ideal_bytes": kv + 2 * qo, "bytes": kv + 2 * qo + partials,
            "flops": 4 * B * T * Hq * L * D}


def rejection_roofline(B, K, V, one_hot_q) -> dict:
    """ROOFLINE.md §2: p, q (dense only) and the noise, each read once in f32."""
    byt = 4 * V * B * ((K + 1) + (0 if one_hot_q else K) + (K + 1))
    return {"bytes": byt, "ideal_bytes": byt, "logs": B * (2 * K + 1) * V}


def _with_floor(row: dict, seconds: float, bw: float | None) -> dict:
    row = dict(row)
    row["us"] = seconds * 1e6
    row["achieved_GBps"] = row["ideal_bytes"] / seconds / 1e9
    if bw:
        row["floor_us"] = row["ideal_bytes"] / bw * 1e6
        row["fraction_of_floor"] = row["floor_us"] / row["us"]
    return row


def time_attention(model: str, shape, point, s: Settings, bw) -> dict:
    """One (B, T, L) point: the Pallas kernel alone (`verify_attention`, what the roofline
    counts) and the engine's two paths, `attend_and_write` with Pallas (scatter the T new
    entries, then the kernel) and with XLA (its blocked loop), all against the same floor."""
    Hq, Hkv, D, _ = shape
    B, T, L = point
    S = max(2048, L) + 9
    dt = jnp.dtype(s.dtype)
    keys = jax.random.split(jax.random.PRNGKey(B * 7 + T * 131 + L), 5)
    q = jax.random.normal(keys[0], (B, T, Hq, D), dt)
    kc = jax.random.normal(keys[1], (B, Hkv, S, D), dt)
    vc = jax.random.normal(keys[2], (B, Hkv, S, D), dt)
    k_new = jax.random.normal(keys[3], (B, T, Hkv, D), dt)
    v_new = jax.random.normal(keys[4], (B, T, Hkv, D), dt)
    pos = jnp.broadcast_to(jnp.arange(L - T, L, dtype=jnp.int32), (B, T))
    rows = jnp.arange(B, dtype=jnp.int32)
    out = {"model": model, "B": B, "T": T, "L": L, "S": S}
    if jax.default_backend() == "gpu":
        r_pad, block_k, splits, _ = attention_pallas.gpu_config(B, T, Hq, Hkv, S, D)
        out.update(splits=splits, r_pad=r_pad, block_k=block_k)
    else:
        r_pad, splits = None, 1
    roof = attention_roofline(B, T, Hq, Hkv, L, D, dt.itemsize, splits, r_pad)
    tiny = jnp.asarray(1e-30, dt)  # keeps each call dependent on the last, values unchanged

    def kernel_only(q, kc, vc, pos, rows, tiny):
        o = kernels.verify_attention(q, kc, vc, pos, rows, backend=s.backend)
        return (q + tiny * o).astype(q.dtype)

    def engine_path(backend):
        def f(x, k_new, v_new, pos, rows, tiny):
            q, kc, vc = x
            o, kc, vc = kernels.attend_and_write(q, k_new, v_new, pos, kc, vc, rows, backend=backend)
            return (q + tiny * o).astype(q.dtype), kc, vc
        return f

    variants = {
        "kernel": lambda: time_chain(kernel_only, jnp.copy(q), (kc, vc, pos, rows, tiny),
                                     s.timing_reps, s.chain),
        s.backend: lambda: time_chain(engine_path(s.backend), (jnp.copy(q), jnp.copy(kc), jnp.copy(vc)),
                                      (k_new, v_new, pos, rows, tiny), s.timing_reps, s.chain),
        "xla": lambda: time_chain(engine_path("xla"), (jnp.copy(q), jnp.copy(kc), jnp.copy(vc)),
                                  (k_new, v_new, pos, rows, tiny), s.timing_reps, s.chain),
    }
    for name, fn in variants.items():
        res = _guard(lambda fn=fn: {"t": fn()})
        out[name] = _with_floor(roof, res["t"], bw) if "t" in res else res
        gc.collect()
    if "us" in out["xla"] and "us" in out[s.backend]:
        out["speedup_vs_xla"] = out["xla"]["us"] / out[s.backend]["us"]
    return out


def rejection_chain_step(backend: str):
    """One call of `time_chain`'s chain for the rejection sampler: `u' = step(u, tiny, p, q,
    d, g)`, each call of the chain given its own copy of p, q and g (`per_call`). The passes
    over the vocabulary read p, q and g, not u: given the same buffers, XLA merges the
    chain's identical passes into one (it timed 10 calls as 1); writing into them to tell
    the calls apart would cost a full pass over each on XLA:CPU."""
    def f(u, tiny, p, q, d, g):
        n, t = kernels.rejection_sample(p, q, d, u, g, backend=backend)
        return u + tiny * (n[:, None] + t[:, :u.shape[1]]).astype(u.dtype)
    return f


def time_rejection(model: str, shape, point, s: Settings, bw) -> dict:
    V = shape[3]
    B, K, one_hot_q = point
    keys = jax.random.split(jax.random.PRNGKey(B * 13 + K), 5)
    p = jax.nn.softmax(jax.random.normal(keys[0], (B, K + 1, V)), -1)
    q = None if one_hot_q else jax.nn.softmax(jax.random.normal(keys[1], (B, K, V)), -1)
    d = jax.random.randint(keys[2], (B, K), 0, V, jnp.int32)
    u = jax.random.uniform(keys[3], (B, K))
    g = jax.random.gumbel(keys[4], (B, K + 1, V))
    roof = rejection_roofline(B, K, V, one_hot_q)
    out = {"model": model, "B": B, "K": K, "V": V, "q": "one-hot" if one_hot_q else "dense"}
    tiny = jnp.float32(1e-30)

    copies = [tuple(None if a is None else jnp.copy(a) for a in (p, q, d, g)) for _ in range(s.chain)]
    for backend in ("xla", s.backend):
        res = _guard(lambda b=backend: {"t": time_chain(rejection_chain_step(b), jnp.copy(u), (tiny,),
                                                       s.timing_reps, s.chain, per_call=copies)})
        out[backend] = _with_floor(roof, res["t"], bw) if "t" in res else res
    if "us" in out["xla"] and "us" in out[s.backend]:
        out["speedup_vs_xla"] = out["xla"]["us"] / out[s.backend]["us"]
    return out


def time_kernels(s: Settings, deadline: float | None = None) -> dict:
    info = device_info()
    bw = info.get("hbm_bytes_per_s")
    attn, rej = [], []
    for i, (model, shape) in enumerate(s.timing_models.items()):
        # gc after each point: its arrays (KV caches, 10 copies of p/q/g) go with its frame
        for point in (s.attn_points if i == 0 else s.attn_points_short):
            attn.append({"model": model, "point": list(point),
                         **_unless_expired(deadline, time_attention, model, shape, point, s, bw)})
            gc.collect()
        for point in (s.rej_points if i == 0 else s.rej_points_short):
            rej.append({"model": model, "point": list(point),
                        **_unless_expired(deadline, time_rejection, model, shape, point, s, bw)})
            gc.collect()
    return {"backend": s.backend, "dtype": s.dtype, "hbm_bytes_per_s": bw, "chain": s.chain,
            "reps": s.timing_reps, "attention": attn, "rejection": rej}


# --------------------------------------------------------------------------- end to end

def _random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=length - i % 3).tolist() for i in range(n)]


def _generate_both(target, draft, prompts, s: Settings, backends, max_seq_len: int,
                   tokenizer=None) -> dict:
    """Greedy and sampled generation with each backend; tokens compared with the first's."""
    import dsd_jax as dsd
    out: dict[str, Any] = {"prompts": len(prompts), "max_tokens": s.e2e_max_tokens, "k": s.e2e_k}
    tokens: dict[str, dict] = {}
    for backend in backends:
        engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=s.e2e_k),
                                max_batch_size=len(prompts), max_seq_len=max_seq_len,
                                batch_buckets=(len(prompts),), prefill_chunk=64,
                                tokenizer=tokenizer, backend=backend)
        # what generate compiles, compiled side by side first
        from dsd_jax.buckets import prefill_pieces
        b = len(prompts)
        chunks = {c for _, c in prefill_pieces(max(map(len, prompts)), engine.programs.prefill_chunks)}
        precompiled = precompile(engine, [("step", s.e2e_k, b)] + [("prefill", b, c) for c in sorted(chunks)]
                                 + [("admit", b), ("move",)], s.compile_threads)
        runs = {}
        for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
            params = [dsd.SamplingParams(temperature=temp, max_tokens=s.e2e_max_tokens, seed=i)
                      for i in range(len(prompts))]
            t0 = time.perf_counter()
            first = engine.generate(prompts, params)  # compiles what it needs
            t1 = time.perf_counter()
            again = engine.generate(prompts, params)
            t2 = time.perf_counter()
            runs[name] = [o.token_ids for o in again]
            out.setdefault(backend, {})[name] = {
                "first_call_s": round(t1 - t0, 3), "second_call_s": round(t2 - t1, 3),
                "tokens": sum(len(o.token_ids) for o in again),
                "deterministic": [o.token_ids for o in first] == runs[name]}
        out[backend]["kernel_backends"] = engine.kernel_backends
        out[backend]["precompiled"] = precompiled
        out[backend]["mean_accepted_len"] = _mean_accepted(engine)
        tokens[backend] = runs
        del engine
        gc.collect()
    ref = tokens[backends[0]]
    for backend in backends[1:]:
        for name in ref:
            a, b = ref[name], tokens[backend][name]
            out.setdefault("identical", {})[f"{backend}/{name}"] = a == b
            if a != b:
                out.setdefault("first_divergence", {})[f"{backend}/{name}"] = [
                    next((i for i, (x, y) in enumerate(zip(r, t)) if x != y), min(len(r), len(t)))
                    if r != t else None for r, t in zip(a, b)]
    out["tokens_identical"] = all(out.get("identical", {}).values())
    out["tokens"] = tokens
    return out


def _mean_accepted(engine) -> float | None:
    try:
        m = engine.metrics()
        return m.get("mean_accepted_len")
    except Exception:  # noqa: BLE001
        return None


NEAR_TIE_ULPS = 4  # a greedy divergence at a top-2 gap within this many bf16 ulps is a near-tie


def _divergence_gap(target, prompts, res, div, s: Settings) -> dict:
    """At the first greedy divergence, the target's top-2 logit gap (XLA, full forward): a
    gap within bf16 rounding means a near-tie, not a kernel bug."""
    from flax import nnx

    from dsd_jax import models
    i = next(j for j, d in enumerate(div) if d is not None)
    seq = list(prompts[i]) + res["tokens"]["xla"]["greedy"][i][:div[i]]
    n = len(seq)
    graph, params = nnx.split(target)
    cfg = target.config

    @jax.jit
    def last_logits(params, tokens):
        pos = jnp.arange(n, dtype=jnp.int32)[None]
        logits, _ = models.forward(graph, params, tokens[None], pos,
                                   models.init_kv_cache(cfg, 1, n), attn_backend="xla")
        return logits[0, -1]

    top = np.sort(np.asarray(last_logits(params, jnp.asarray(seq, jnp.int32)), np.float64))[-2:]
    gap = float(top[1] - top[0])
    # a bf16 ulp at the top logit's magnitude: two backends that round a long bf16 sum
    # differently can swap two logits this close (random weights make such near-ties common)
    ulp = 2.0 ** (np.floor(np.log2(max(abs(top[1]), 1e-30))) - 7)
    return {"request": i, "position": div[i], "top2_gap": gap, "top1_logit": float(top[1]),
            "gap_in_bf16_ulps": round(gap / ulp, 2), "near_tie": bool(gap <= NEAR_TIE_ULPS * ulp)}


def e2e_builtin(s: Settings) -> dict:
    from dsd_jax import models
    target, draft, tok = models.builtin(dtype="float32")
    prompts = [tok.encode(p).ids[-48:] for p in models.heldout_prompts(s.e2e_batch)]
    # both backends exact float32 (XLA on a GPU would run f32 dots in TF32, the kernel does not)
    with jax.default_matmul_precision("highest"):
        res = _generate_both(target, draft, prompts, s, ("xla", s.backend),
                             48 + s.e2e_max_tokens + 8, tok)
    return {"pair": "builtin (float32, matmul precision highest)", **res}


def e2e_synthetic(s: Settings) -> dict:
    from dsd_jax.models import synthetic
    t_name, d_name = s.e2e_pair
    target = synthetic(t_name, dtype=s.dtype, seed=0)
    draft = synthetic(d_name, dtype=s.dtype, seed=1)
    prompts = _random_prompts(target.config.vocab_size, s.e2e_batch, s.e2e_prompt_len)
    res = _generate_both(target, draft, prompts, s, ("xla", s.backend),
                         s.e2e_prompt_len + s.e2e_max_tokens + 8)
    div = (res.get("first_divergence") or {}).get(f"{s.backend}/greedy")
    if div:
        res["greedy_divergence_top2_gap"] = _guard(_divergence_gap, target, prompts, res, div, s)
    del target, draft
    gc.collect()
    return {"pair": f"{t_name} + {d_name} ({s.dtype}, random weights)", **res}


def end_to_end(s: Settings, deadline: float | None = None) -> dict:
    out = {}
    if s.builtin:
        out["builtin"] = _unless_expired(deadline, e2e_builtin, s)
    out["synthetic"] = _unless_expired(deadline, e2e_synthetic, s)
    compared = [r for r in out.values() if "skipped" not in r]
    out["tokens_identical"] = bool(compared) and all(r.get("tokens_identical") is True for r in compared)
    return out


# --------------------------------------------------------------------------- profile

def profile_with_acceptance(engine, acceptance: Sequence[float], **kw):
    """`profiler.profile_engine(engine, **kw)` with the acceptance given, not measured: the
    latency table is measured on this device, a_1..a_max_k are `acceptance` (at least
    max_k values; extra ones are dropped). Returns the `Profile`."""
    from dsd_jax.profiler import profile_engine
    acc = [float(a) for a in acceptance]
    if len(acc) < engine.max_k:
        raise ValueError(f"need at least max_k={engine.max_k} acceptance values, got {len(acc)}")
    acc = acc[:engine.max_k]
    prof = profile_engine(engine, acceptance=acc, **kw)
    prof.meta["acceptance_source"] = "given"
    return prof


def k_schedule(profile, acceptance: Sequence[float], context_len: float | None = None,
               batch_sizes: Sequence[int] | None = None) -> list[dict]:
    """argmax_K AL(K) / ITL(B, K) per batch size (the goodput rule, no margin), with
    AL(K) = 1 + a_1 + ... + a_K over the profile's Ks."""
    acc = list(acceptance)[:profile.max_k]
    acc += [0.0] * (profile.max_k - len(acc))
    al = np.concatenate([[1.0], 1.0 + np.cumsum(acc)])
    rows = []
    for b in batch_sizes or profile.batch_sizes:
        itl = np.array([profile.itl_ms(b, k, context_len) for k in profile.ks])
        good = al[np.asarray(profile.ks)] / itl
        best = int(profile.ks[int(np.argmax(good))])
        rows.append({"B": int(b), "best_k": best, "itl_ms": itl.round(4).tolist(),
                     "goodput_tok_per_ms_row": good.round(4).tolist(),
                     "speedup_vs_k0": float(good.max() / good[0])})
    return rows


def controller_schedule(profile, context_len: float | None = None) -> list[dict]:
    """The K the engine's goodput controller (`dsd_jax.controller.Controller`, default
    `DynamicConfig`: margin, hysteresis) picks first at each profiled batch size, starting
    from K = 0, with the profile's acceptance as its prior."""
    from dsd_jax.config import DynamicConfig, SpecConfig
    from dsd_jax.controller import Controller
    spec = SpecConfig(num_speculative_tokens=profile.max_k, dynamic=DynamicConfig())
    rows = []
    for b in profile.batch_sizes:
        ctl = Controller(spec, profile, max_batch_size=max(profile.batch_sizes),
                         batch_buckets=profile.batch_sizes)
        rows.append({"B": int(b), "best_k": int(ctl.choose_k(int(b), context_len))})
    return rows


def schedule_ranges(rows: Sequence[dict]) -> list[list[int]]:
    """[[start_bs, end_bs, K], ...] (vLLM's per-batch-size format) from `k_schedule` rows."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][2] == r["best_k"]:
            out[-1][1] = r["B"]
        else:
            out.append([r["B"], r["B"], r["best_k"]])
    return out


def precompile(engine, jobs: Sequence[tuple], threads: int = 8, deadline: float | None = None) -> str:
    """Compiles `engine.programs` programs ahead of use, `threads` at a time (XLA compiles
    release the GIL); a job is a method name and its arguments, e.g. ("step", 4, 1). The
    first job compiles first, alone: give one holding both kernels (a K > 0 step), so a
    Pallas fallback happens before the threads start. Jobs are started in order, none after
    `deadline` (a `time.perf_counter()` value) but the first. Anything that fails or is left
    here is left for the first use to compile (and report)."""
    from concurrent.futures import ThreadPoolExecutor
    programs = engine.programs
    fallback = programs._fallback
    jobs = list(dict.fromkeys(tuple(j) for j in jobs))
    # the caller's `jax.default_matmul_precision` is thread-local: the workers re-enter it,
    # or their programs would compile at the default precision (TF32 dots on a GPU)
    precision = jax.config.jax_default_matmul_precision

    def compile_job(job) -> bool:
        if job is not jobs[0] and _expired(deadline):
            return False
        with jax.default_matmul_precision(precision):
            getattr(programs, job[0])(*job[1:])
        return True

    try:
        compile_job(jobs[0])
        programs._fallback = False  # no kernel switch while threads compile
        with ThreadPoolExecutor(max(1, threads)) as pool:
            done = 1 + sum(pool.map(compile_job, jobs[1:]))
        left = f" ({len(jobs) - done} left: time budget)" if done < len(jobs) else ""
        return f"{done} programs, {threads} threads{left}"
    except Exception as e:  # noqa: BLE001
        return f"incomplete ({_first_line(e)}); the rest compiled one by one"
    finally:
        programs._fallback = fallback


def precompile_steps(engine, ks, buckets, threads: int = 8, deadline: float | None = None) -> str:
    """`precompile` of the (K, B) step programs bucket after bucket in the order given, the
    largest K of the first bucket first."""
    ks, buckets = list(ks), list(buckets)
    return precompile(engine, [("step", ks[-1], buckets[0])]
                      + [("step", k, b) for b in buckets for k in ks], threads, deadline)


def bucket_order(buckets: Sequence[int]) -> list[int]:
    """`Settings.profile_buckets` checked: distinct positive batch sizes, order kept."""
    order = [int(b) for b in buckets]
    if not order or len(set(order)) != len(order) or min(order) < 1:
        raise ValueError(f"profile buckets must be distinct positive batch sizes, got {list(buckets)}")
    return order


def profile_pair(s: Settings, out_dir: str | None = None, deadline: float | None = None) -> dict:
    """The synthetic pair's ITL(B, K) profile and the K schedules it implies. Under a
    `deadline`, the step programs compile in the order of `s.profile_buckets` for at most
    `PROFILE_COMPILE_SHARE` of the time, the compiled buckets are timed until
    `PROFILE_RESERVE_S` before it, and the profile holds those timed (its meta says what
    was cut)."""
    import dsd_jax as dsd
    from dsd_jax.models import synthetic
    from dsd_jax.profiler import format_profile
    order = bucket_order(s.profile_buckets)
    t_name, d_name = s.profile_pair
    target = synthetic(t_name, dtype=s.dtype, seed=0)
    draft = synthetic(d_name, dtype=s.dtype, seed=1)
    engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=s.profile_max_k),
                            max_batch_size=max(order),
                            max_seq_len=s.profile_max_seq_len or max(s.profile_contexts) + 64,
                            batch_buckets=tuple(sorted(order)), backend="auto")
    del target, draft
    t0 = time.perf_counter()
    ks = range(s.profile_max_k + 1)
    timing_end = compile_end = None
    if deadline is not None:
        timing_end = deadline - PROFILE_RESERVE_S
        compile_end = t0 + PROFILE_COMPILE_SHARE * max(0.0, timing_end - t0)
    compiled = precompile_steps(engine, ks, order, s.compile_threads, compile_end)
    t_compile = time.perf_counter() - t0
    # only buckets whose programs are all compiled, unless precompiling failed (then the
    # profile compiles each as it reaches it)
    ready = [b for b in order if all(engine.programs.is_compiled("step", k, b) for k in ks)]
    prof = profile_with_acceptance(engine, s.acceptance, context_lengths=s.profile_contexts,
                                   repeats=s.profile_repeats, warmup_reps=s.profile_warmup_reps,
                                   batch_sizes=ready or order, deadline=timing_end)
    prof.meta["synthetic"] = {"target": t_name, "draft": d_name, "dtype": s.dtype}
    path = None
    if out_dir:
        path = os.path.join(out_dir, "profile.json")
        prof.save(path)
    schedules = {str(c): k_schedule(prof, s.acceptance, c) for c in prof.context_lengths}
    res = {"pair": f"{t_name} + {d_name} ({s.dtype})", "kernel_backends": engine.kernel_backends,
           "seconds": round(time.perf_counter() - t0, 1), "compile_seconds": round(t_compile, 1),
           "precompiled": compiled, "profile_path": path, "truncated": prof.meta.get("truncated"),
           "batch_sizes": list(prof.batch_sizes), "ks": list(prof.ks),
           "context_lengths": list(prof.context_lengths), "latency_ms": prof.latency_ms,
           "latency_ms_raw": prof.meta.get("latency_ms_raw"), "acceptance": list(prof.acceptance),
           "k_schedule": schedules,
           "k_schedule_ranges": {c: schedule_ranges(r) for c, r in schedules.items()},
           "controller_schedule_ranges": {
               str(c): schedule_ranges(controller_schedule(prof, c)) for c in prof.context_lengths},
           "vllm_h100_schedule": VLLM_H100_SCHEDULE, "table": format_profile(prof)}
    del engine
    gc.collect()
    return res


# --------------------------------------------------------------------------- report

def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _not_run(row: dict) -> str:
    return f"skipped ({row['skipped']})" if "skipped" in row else f"ERROR {row.get('error')}"


def format_report(results: dict) -> str:
    info = results.get("device", {})
    lines = [f"device_check: {info.get('device_kind')} ({info.get('platform')}), jax {info.get('jax')}, "
             f"mode {results.get('mode')}", ""]
    failed = {n: results[n]["error"] for n in SECTIONS
              if isinstance(results.get(n), dict) and "error" in results[n]}
    for name, err in failed.items():
        lines.append(f"## {name}: ERROR {err}")
    if failed:
        lines.append("")
    results = {n: v for n, v in results.items() if n not in failed}
    k = results.get("kernels")
    if k:
        lines.append(f"## Kernels on the device ({k.get('backend')} vs xla): {k.get('passed')}/{k.get('total')} passed"
                     + (f", {k['skipped']} skipped ({SKIPPED})" if k.get("skipped") else ""))
        for r in k.get("attention", []):
            lines.append(f"  attention {r.get('case', '?')}: " + (
                f"rel err {r['rel_err']:.2e} (tol {r['tol']:.0e}), NaN match {r['nan_match']} -> "
                f"{'OK' if r['ok'] else 'FAIL'}" if "rel_err" in r else _not_run(r)))
        for r in k.get("rejection", []):
            lines.append(f"  rejection {r.get('case', '?')}: " + (
                f"tokens identical {r['tokens_identical']} -> {'OK' if r['ok'] else 'FAIL'}"
                if "ok" in r else _not_run(r)))
        lines.append("")
    t = results.get("timings")
    if t:
        be = t.get("backend")
        bw = t.get("hbm_bytes_per_s")
        lines.append(f"## Kernel timings ({t.get('dtype')}; us per call, chain of {t.get('chain')}; "
                     + (f"floor = ideal bytes / {bw / 1e12:.2f} TB/s)" if bw else
                        "no floor: HBM bandwidth of this device unknown)"))
        lines.append("  attention: kernel = verify_attention alone; xla and " + be + " = the engine's "
                     "attend_and_write (scatter + attention); frac = floor / time")
        lines.append(f"  attention  model          B   T     L | kernel us  GB/s  frac | {be} us  frac | "
                     f"xla us  frac | floor us | xla/{be}")
        for r in t.get("attention", []):
            if "error" in r or "skipped" in r:
                lines.append(f"  attention  {r.get('model')} {r.get('point')}: {_not_run(r)}")
                continue
            x, p, kk = r.get("xla", {}), r.get(be, {}), r.get("kernel", {})
            lines.append(f"  attention  {r['model']:<12} {r['B']:>3} {r['T']:>3} {r['L']:>5} | "
                         f"{_fmt(kk.get('us')):>9} {_fmt(kk.get('achieved_GBps'), '.0f'):>5} "
                         f"{_fmt(kk.get('fraction_of_floor'), '.2f'):>5} | {_fmt(p.get('us')):>6} "
                         f"{_fmt(p.get('fraction_of_floor'), '.2f'):>5} | {_fmt(x.get('us')):>6} "
                         f"{_fmt(x.get('fraction_of_floor'), '.2f'):>5} | "
                         f"{_fmt(kk.get('floor_us', x.get('floor_us'))):>8} | {_fmt(r.get('speedup_vs_xla'), '.2f')}"
                         + "".join(f"  [{n}: {v['error']}]" for n, v in (("kernel", kk), (be, p), ("xla", x))
                                   if "error" in v))
        lines.append(f"  rejection  model          B   K  q       |  xla us  {be} us | floor us | "
                     f"{be} GB/s  frac | xla frac | speedup")
        for r in t.get("rejection", []):
            if "error" in r or "skipped" in r:
                lines.append(f"  rejection  {r.get('model')} {r.get('point')}: {_not_run(r)}")
                continue
            x, p = r.get("xla", {}), r.get(be, {})
            lines.append(f"  rejection  {r['model']:<12} {r['B']:>3} {r['K']:>3}  {r['q']:<7} | "
                         f"{_fmt(x.get('us')):>7} {_fmt(p.get('us')):>9} | {_fmt(p.get('floor_us', x.get('floor_us'))):>8} | "
                         f"{_fmt(p.get('achieved_GBps'), '.0f'):>7} {_fmt(p.get('fraction_of_floor'), '.2f'):>5} | "
                         f"{_fmt(x.get('fraction_of_floor'), '.2f'):>8} | {_fmt(r.get('speedup_vs_xla'), '.2f')}"
                         + (f"  [{be}: {p['error']}]" if "error" in p else "")
                         + (f"  [xla: {x['error']}]" if "error" in x else ""))
        lines.append("")
    e = results.get("e2e")
    if e:
        lines.append(f"## End to end: tokens identical across backends: {e.get('tokens_identical')}")
        for key in ("builtin", "synthetic"):
            r = e.get(key)
            if not r:
                continue
            if "error" in r or "skipped" in r:
                lines.append(f"  {key}: {_not_run(r)}")
                continue
            lines.append(f"  {r['pair']}: K={r['k']}, {r['prompts']} prompts x {r['max_tokens']} tokens; "
                         f"identical {r.get('identical')}")
            for be, v in r.items():
                if isinstance(v, dict) and "kernel_backends" in v:
                    lines.append(f"    {be}: kernels {v['kernel_backends']}; greedy "
                                 f"{v['greedy']['second_call_s']} s, sampled {v['sampled']['second_call_s']} s "
                                 f"(first calls {v['greedy']['first_call_s']} / {v['sampled']['first_call_s']} s)")
            if r.get("first_divergence"):
                lines.append(f"    first divergence per prompt: {r['first_divergence']}")
            gap = r.get("greedy_divergence_top2_gap")
            if gap:
                verdict = ("" if "near_tie" not in gap else " -> a near-tie (bf16 rounding), not a kernel bug"
                           if gap["near_tie"] else " -> NOT a near-tie: look for a kernel bug")
                lines.append(f"    target's top-2 logit gap at the first greedy divergence: {gap}{verdict}")
        lines.append("")
    p = results.get("profile")
    if p:
        lines.append(f"## ITL(B, K) profile of {p['pair']} (kernels {p['kernel_backends']}, "
                     f"{p['seconds']} s, of which compiling {p.get('compile_seconds')} s: "
                     f"{p.get('precompiled')})")
        if p.get("truncated"):
            lines.append(f"  cut by the time budget: {p['truncated']}")
        lines.append(p["table"])
        lines.append(f"K schedule from the goodput rule with a_i = {list(p['acceptance'])}:")
        for c, ranges in p["k_schedule_ranges"].items():
            lines.append(f"  context {c}: [start_bs, end_bs, K] = {ranges} (argmax AL/ITL); the "
                         f"controller, from K=0 with its margin: "
                         f"{p.get('controller_schedule_ranges', {}).get(c)}")
        lines.append(f"vLLM PR, profiled on an H100: {p['vllm_h100_schedule']}")
    return "\n".join(lines) + "\n"


def write_results(results: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "device_check.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(out_dir, "device_check.txt"), "w") as f:
        f.write(format_report(results))


def section_deadline(sections: Sequence[str], end: float | None, now: float | None = None) -> float | None:
    """The deadline of `sections[0]`, starting `now`, when the run must end at `end` and
    `sections[1:]` still follow: its `SECTION_WEIGHTS` share of the time left (all of it
    for a weight of None or the last section)."""
    if end is None:
        return None
    now = time.perf_counter() if now is None else now
    weight = SECTION_WEIGHTS[sections[0]]
    if weight is None or len(sections) == 1:
        return end
    total = weight + sum(SECTION_WEIGHTS[n] or 0 for n in sections[1:])
    return now + max(0.0, end - now) * weight / total


def run(out_dir: str, settings: Settings, sections: Sequence[str] = SECTIONS, mode: str = "gpu",
        log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
        time_budget_s: float | None = None) -> dict:
    """Runs `sections` in order, rewriting the JSON and text report after each. With
    `time_budget_s`, each section gets a deadline (`section_deadline`) and stops starting
    items past it; a section that would start after the budget is skipped (and says so)."""
    bad = [x for x in sections if x not in SECTIONS]
    if bad:
        raise ValueError(f"unknown sections {bad}; choose from {SECTIONS}")
    os.makedirs(out_dir, exist_ok=True)  # sections write into it (profile.json) before the report
    results: dict[str, Any] = {"mode": mode, "device": device_info(),
                               "settings": dataclasses.asdict(settings), "seconds": {}}
    steps = {"kernels": check_kernels, "timings": time_kernels, "e2e": end_to_end,
             "profile": functools.partial(profile_pair, out_dir=out_dir)}
    start = time.perf_counter()
    end = None if time_budget_s is None else start + time_budget_s
    for i, name in enumerate(sections):
        used = time.perf_counter() - start
        if time_budget_s is not None and used > time_budget_s:
            results[name] = {"error": f"skipped: {used:.0f} s of the {time_budget_s:.0f} s budget "
                                      f"used; run --sections {name} separately"}
            log(f"device_check: {name} skipped (time budget)")
            write_results(results, out_dir)
            continue
        deadline = section_deadline(sections[i:], end)
        log(f"device_check: {name} ..." + ("" if deadline is None else
                                            f" (until {deadline - start:.0f} s of {time_budget_s:.0f})"))
        t0 = time.perf_counter()
        results[name] = _guard(steps[name], settings, deadline=deadline)
        results["seconds"][name] = round(time.perf_counter() - t0, 1)
        log(f"device_check: {name} done in {results['seconds'][name]} s"
            + (f" (ERROR {results[name]['error']})" if "error" in results[name] else ""))
        write_results(results, out_dir)
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, metavar="DIR", help="folder for device_check.{json,txt}, profile.json")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, interpret mode, on the CPU")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--profile-buckets", metavar="B,B,...", help="batch buckets of the ITL profile")
    p.add_argument("--profile-contexts", metavar="N,N,...", help="context lengths of the ITL profile")
    p.add_argument("--no-builtin", action="store_true", help="skip the built-in pair in e2e")
    p.add_argument("--e2e-pair", metavar="TARGET,DRAFT", help="synthetic pair of the e2e section "
                   "(default llama-3.1-8b,llama-3.2-1b)")
    p.add_argument("--profile-pair", metavar="TARGET,DRAFT", help="synthetic pair of the profile "
                   "(default llama-3.1-8b,llama-3.2-1b; e.g. qwen3-8b,qwen3-0.6b)")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="skip the sections that would start after this many seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kw: dict[str, Any] = {}
    if args.profile_buckets:
        kw["profile_buckets"] = tuple(int(x) for x in args.profile_buckets.split(","))
    if args.profile_contexts:
        kw["profile_contexts"] = tuple(int(x) for x in args.profile_contexts.split(","))
    if args.no_builtin:
        kw["builtin"] = False
    for flag, key in (("e2e_pair", "e2e_pair"), ("profile_pair", "profile_pair")):
        value = getattr(args, flag)
        if value:
            pair = tuple(x.strip() for x in value.split(","))
            if len(pair) != 2:
                raise SystemExit(f"device_check: --{flag.replace('_', '-')} needs TARGET,DRAFT, got {value!r}")
            kw[key] = pair
    settings = Settings.cpu_smoke(**kw) if args.cpu_smoke else Settings.gpu(**kw)
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    results = run(args.out, settings, sections, mode="cpu-smoke" if args.cpu_smoke else "device",
                  time_budget_s=args.time_budget)
    print(format_report(results))
    return 0
