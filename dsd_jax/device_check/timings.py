"""The ``timings`` section: each kernel against XLA at real model shapes, beside its roofline."""

from __future__ import annotations

import functools
import gc
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from dsd_jax import kernels
from dsd_jax.kernels import attention_pallas, rejection_pallas

from .settings import Settings, _guard, _unless_expired, device_info


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
        tiling = attention_pallas.gpu_config(B, T, Hq, Hkv, S, D, dtype=dt)
        r_pad, splits = tiling.r_pad, tiling.splits
        out.update(splits=splits, r_pad=r_pad, row_tile=tiling.row_tile, block_k=tiling.block_k)
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


def rejection_chain_step(backend: str | None = None, sample: Callable | None = None):
    """One call of `time_chain`'s chain for the rejection sampler: `u' = step(u, tiny, p, q,
    d, g)`, each call of the chain given its own copy of p, q and g (`per_call`). The passes
    over the vocabulary read p, q and g, not u: given the same buffers, XLA merges the
    chain's identical passes into one (it timed 10 calls as 1); writing into them to tell
    the calls apart would cost a full pass over each on XLA:CPU. `sample(p, q, d, u, g)`
    replaces `kernels.rejection_sample(..., backend=backend)` (a variant's tiling)."""
    sample = sample or functools.partial(kernels.rejection_sample, backend=backend)

    def f(u, tiny, p, q, d, g):
        n, t = sample(p, q, d, u, g)
        return u + tiny * (n[:, None] + t[:, :u.shape[1]]).astype(u.dtype)
    return f


def vocab_pass_chain_step(interpret: bool):
    """As `rejection_chain_step`, the Pallas pass over the vocabulary alone
    (`rejection_pallas.vocab_pass`), without the step that turns its statistics into tokens
    (on a GPU the finish kernel): what share of the sampler's time the pass is. Each call
    depends on the last through one element a row of each output."""
    def f(u, tiny, p, q, d, g):
        outs = rejection_pallas.vocab_pass(p, q, d, g, interpret=interpret)
        dep = sum(o.reshape(o.shape[0], -1)[:, 0].astype(u.dtype) for o in outs)
        return u + tiny * dep[:, None]
    return f


def time_rejection(model: str, shape, point, s: Settings, bw, split_sweep: bool = True) -> dict:
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
    if s.backend in ("pallas", "interpret"):
        res = _guard(lambda: {"t": time_chain(vocab_pass_chain_step(s.backend == "interpret"), jnp.copy(u),
                                              (tiny,), s.timing_reps, s.chain, per_call=copies)})
        out["kernel"] = _with_floor(roof, res["t"], bw) if "t" in res else res
        if split_sweep and s.rej_split_factors and (s.backend == "interpret"
                                                    or jax.default_backend() == "gpu"):
            out["gpu_splits"] = _time_gpu_splits(B, K, V, s, lambda step: time_chain(
                step, jnp.copy(u), (tiny,), s.timing_reps, s.chain, per_call=copies))
    if "us" in out["xla"] and "us" in out[s.backend]:
        out["speedup_vs_xla"] = out["xla"]["us"] / out[s.backend]["us"]
    return out


def _time_gpu_splits(B, K, V, s: Settings, timed: Callable) -> list[dict]:
    """The GPU sampler at its default vocab splits and at `s.rej_split_factors` times as
    many (each timed by `timed(chain step)`): the default aims at ~2 waves of programs, and
    at B = 64 that is one split, so each program walks the whole vocabulary alone.
    Interpreted on a CPU, which times nothing real but runs every variant."""
    default = rejection_pallas.gpu_config(B, K, V)[1]
    num_tiles = -(-V // rejection_pallas.GPU_BLOCK_V)
    rows = []
    for splits in sorted({min(default * f, num_tiles) for f in (1, *s.rej_split_factors)}):
        sample = functools.partial(rejection_pallas.rejection_sample, platform="gpu",
                                   interpret=s.backend == "interpret", num_splits=splits)
        res = _guard(lambda: {"us": 1e6 * timed(rejection_chain_step(sample=sample))})
        rows.append({"splits": splits, "default": splits == default, **res})
        gc.collect()
    return rows


def chain_overhead_us(s: Settings) -> float:
    """Microseconds per call of a chain of trivial calls (one tiny op on one element): what a
    timed call costs beyond its kernel's work, its share of the dispatch included. At B = 1-8
    the kernels take a few microseconds, so this is beside their times in the report."""
    return 1e6 * time_chain(lambda x: x + 1.0, jnp.zeros((1,), jnp.float32), (), s.timing_reps, s.chain)


def time_kernels(s: Settings, deadline: float | None = None) -> dict:
    info = device_info()
    bw = info.get("hbm_bytes_per_s")
    overhead = _guard(chain_overhead_us, s)
    attn, rej = [], []
    for i, (model, shape) in enumerate(s.timing_models.items()):
        # gc after each point: its arrays (KV caches, 10 copies of p/q/g) go with its frame
        for point in (s.attn_points if i == 0 else s.attn_points_short):
            attn.append({"model": model, "point": list(point),
                         **_unless_expired(deadline, time_attention, model, shape, point, s, bw)})
            gc.collect()
        for point in (s.rej_points if i == 0 else s.rej_points_short):
            rej.append({"model": model, "point": list(point),
                        **_unless_expired(deadline, time_rejection, model, shape, point, s, bw,
                                          split_sweep=i == 0)})
            gc.collect()
    return {"backend": s.backend, "dtype": s.dtype, "hbm_bytes_per_s": bw, "chain": s.chain,
            "reps": s.timing_reps, "chain_overhead_us": overhead, "attention": attn, "rejection": rej}
