"""Pallas rejection sampling: one fused pass over the vocabulary per (sequence, position).

Same contract and the same tokens as `rejection_ref.rejection_sample_xla` (read its
docstring), for finite noise (Gumbel noise is). The vocabulary is the only big axis:
p, q and the Gumbel noise are [B, K+1, V] with V ~ 128k-152k, so the pass streams
them once, tile by tile, and keeps per row only running scalars:

* max / first argmax of log r_i + g_i   (r = max(p - q, 0): the recovered token; with
                                   finite noise the max is > -inf iff r has mass, the
                                   reference's `sum(r) > 0`),
* max / first argmax of log p_i + g_i   (bonus token for i = K+1, and the
                                   reference's fallback row when r has no mass).

A running argmax only replaces its index on a strictly greater tile maximum and
the tile's index is the smallest column attaining it, so ties resolve to the
first maximal index exactly like `jnp.argmax`. Columns past V (the ragged last
tile: V = 151936 or 128256 is not a tile multiple) score -inf and carry zero
probability, which is the "pad with zero probability" rule without copying the
inputs. `draft_probs=None` means one-hot q at the draft token: q is then built
in-kernel from the token id and never read from memory.

The accept test `u_i * q_i(d_i) < p_i(d_i)`, the first rejection and the token
select need only scalars per (sequence, position):

* GPU (Pallas Triton), two calls and no XLA op around them.
  - The pass: grid (B, K+1, splits); a program walks its share of the vocab tiles
    of one row in a `fori_loop` with masked loads, keeping four running statistics
    per lane and reducing them across the block once at the end. block_v = 1024 (a
    power of two, as Triton requires; 8 elements a thread), splits chosen so
    B*(K+1)*splits fills ~2 waves of SMs. With a one-hot q the residual is p off
    the draft column, so an element costs one log, not two.
  - The finish kernel: one program per sequence merges the splits, reads p(d_i),
    q(d_i) and (one-hot q) the draft column's residual score directly, and writes
    the accepted count and the tokens.
* TPU (Pallas Mosaic): grid (B, V tiles), vocab axis "arbitrary"; blocks
  (K+1, block_v) with block_v = 8192 (multiple of 128; the row dim is the full
  K+1), draft ids scalar-prefetched into SMEM; running statistics (also p(d),
  q(d) and max r as masked sums and a max) live in the lane-replicated
  [rows, 128] output blocks, resident across the vocab axis. Only offset-0 row
  slices are used (rows 0..K-1 for the residual, all K+1 rows for p), so no
  unaligned sublane access. The epilogue is a few-element XLA computation.

No cumsum/sort/gather inside the kernels (Mosaic and Triton reject some of those;
interpret mode would not notice): only elementwise ops, max/min/sum reductions,
compares and (the finish kernel) scalar loads at a draft token's column.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .attention_pallas import DEFAULT_GPU_SMS, _lanes, _next_pow2, resolve_platform
from .rejection_ref import first_rejection

NEG_INF = float("-inf")
BIG_INDEX = 2 ** 31 - 1
GPU_BLOCK_V = 1024
TPU_BLOCK_V = 8192
LANES = 128


def _tile_argmax(scores, cols, keepdims=True):
    """Max over the last axis and the smallest column attaining it."""
    m = jnp.max(scores, axis=-1, keepdims=keepdims)
    mb = m if keepdims else m[..., None] if scores.ndim > 1 else m
    idx = jnp.min(jnp.where(scores == mb, cols, BIG_INDEX), axis=-1, keepdims=keepdims)
    return m, idx


# ----------------------------------------------------------------------------- GPU (Triton)

def _gpu_kernel(*refs, V, K, block_v, tiles_per_split, one_hot_q):
    from jax.experimental.pallas import triton as plgpu

    d_ref, *refs = refs if K else (None, *refs)
    p_ref, n_ref, *rest = refs
    q_ref, out_refs = (None, rest) if one_hot_q or not K else (rest[0], rest[1:])
    res_best_ref, res_idx_ref, p_best_ref, p_idx_ref = out_refs

    i = pl.program_id(1)
    s = pl.program_id(2)
    d = jnp.where(i < K, d_ref[()], -1) if K else -1     # this row's draft; none for the bonus row
    num_tiles = pl.cdiv(V, block_v)
    lo = s * tiles_per_split
    hi = jnp.minimum(lo + tiles_per_split, num_tiles)
    offs = jnp.arange(block_v, dtype=jnp.int32)

    # Running statistics per lane (column offset within a tile), reduced across the block
    # once after the loop, not once per tile: a block reduction crosses warps, and seven a
    # tile made the kernel slower than XLA on an H200. A lane replaces its best only on a
    # strictly greater score, so it holds its earliest column attaining its max, and the
    # smallest such column over the lanes attaining the overall max is the first argmax.
    def body(t, carry):
        res_best, res_idx, p_best, p_idx = carry
        start = pl.multiple_of(t * block_v, block_v)
        cols = start + offs
        valid = cols < V
        p = plgpu.load(p_ref.at[pl.ds(start, block_v)], mask=valid, other=0.0)
        g = plgpu.load(n_ref.at[pl.ds(start, block_v)], mask=valid, other=0.0)
        ps = jnp.where(valid, jnp.log(p) + g, NEG_INF)
        if q_ref is None:
            # one-hot q: r = p off the draft column, so its score is log p + g (one log an
            # element); the draft column's own score is added by the finish kernel
            rs = jnp.where(cols == d, NEG_INF, ps)
        else:
            # the bonus row (i = K) has no draft distribution: its block (row K - 1) is not read
            q = plgpu.load(q_ref.at[pl.ds(start, block_v)], mask=valid & (i < K), other=0.0)
            rs = jnp.where(valid, jnp.log(jnp.maximum(p - q, 0.0)) + g, NEG_INF)
        better_r = rs > res_best
        better_p = ps > p_best
        return (jnp.where(better_r, rs, res_best), jnp.where(better_r, cols, res_idx),
                jnp.where(better_p, ps, p_best), jnp.where(better_p, cols, p_idx))

    neg_inf = jnp.full((block_v,), NEG_INF, jnp.float32)
    zeros_i = jnp.zeros((block_v,), jnp.int32)
    carry = lax.fori_loop(lo, hi, body, (neg_inf, zeros_i, neg_inf, zeros_i))
    res_best, res_idx, p_best, p_idx = carry
    for ref, val in zip(out_refs, (*_lane_argmax(res_best, res_idx), *_lane_argmax(p_best, p_idx))):
        plgpu.store(ref, val)


def _lane_argmax(best, idx):
    """Max over lanes and the smallest index among the lanes attaining it (each lane's index
    its earliest column attaining that lane's max); (-inf, 0) when no lane scored."""
    m = jnp.max(best)
    return m, jnp.min(jnp.where(best == m, idx, BIG_INDEX))


def gpu_config(B, K, V, block_v=None, num_splits=None):
    """Static tiling for the Triton variant: (block_v, splits, tiles_per_split)."""
    block_v = GPU_BLOCK_V if block_v is None else block_v
    if block_v & (block_v - 1):
        raise ValueError(f"Triton block_v must be a power of two, got {block_v}")
    num_tiles = -(-V // block_v)
    if num_splits is None:
        try:
            sms = int(jax.devices("gpu")[0].core_count)
        except Exception:
            sms = DEFAULT_GPU_SMS
        num_splits = _next_pow2(-(-2 * sms // (B * (K + 1))))
        num_splits = max(1, min(num_splits, num_tiles // 2 or 1, 32))
    tiles_per_split = -(-num_tiles // num_splits)
    num_splits = -(-num_tiles // tiles_per_split)     # drop empty splits
    return block_v, num_splits, tiles_per_split


def _pass_gpu(target_probs, draft_probs, draft_tokens, residual_noise, *, interpret,
              block_v, num_splits):
    """The Triton pass: per (row, draft position, vocab split) the best score and first
    argmax of the residual and of p (`_gpu_kernel`), as four [B, K+1, next_pow2(splits)]
    arrays (entries past `splits` unwritten); and the number of splits."""
    from jax.experimental.pallas import triton as plgpu

    B, K1, V = target_probs.shape
    K = K1 - 1
    block_v, splits, tiles_per_split = gpu_config(B, K, V, block_v, num_splits)
    one_hot_q = draft_probs is None
    in_specs, args = [], []
    if K:  # the bonus row (i = K) re-reads draft K - 1 and ignores it
        in_specs.append(pl.BlockSpec((None, None), lambda b, i, s: (b, jnp.minimum(i, K - 1))))
        args.append(draft_tokens.astype(jnp.int32))
    row = pl.BlockSpec((None, None, V), lambda b, i, s: (b, i, 0))
    in_specs += [row, row]
    args += [target_probs, residual_noise]
    if K and not one_hot_q:
        in_specs.append(pl.BlockSpec((None, None, V),
                                     lambda b, i, s: (b, jnp.minimum(i, K - 1), 0)))
        args.append(draft_probs)
    stat = pl.BlockSpec((None, None, None), lambda b, i, s: (b, i, s))
    # the split axis padded to a power of two: the finish kernel loads it as one vector
    padded = (B, K1, _next_pow2(splits))
    f32, i32 = (jax.ShapeDtypeStruct(padded, t) for t in (jnp.float32, jnp.int32))
    kernel = functools.partial(_gpu_kernel, V=V, K=K, block_v=block_v,
                               tiles_per_split=tiles_per_split, one_hot_q=one_hot_q)
    stats = pl.pallas_call(
        kernel, grid=(B, K1, splits), in_specs=in_specs, out_specs=(stat,) * 4,
        out_shape=(f32, i32, f32, i32), interpret=interpret, name="rejection_pass_triton",
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
    )(*args)
    return stats, splits


def _gpu_finish_kernel(*refs, K, V, splits, one_hot_q):
    """One program per sequence: merges the vocab splits of each position's statistics,
    then the accept test, the first rejection and the token select, on scalars. (As XLA
    ops around the pass, this epilogue and the split merge were some 70 small ops.)"""
    from jax.experimental.pallas import triton as plgpu

    if K:
        d_ref, u_ref, p_ref, g_ref, *refs = refs
        q_ref, *refs = (None, *refs) if one_hot_q else refs
    res_best, res_idx, p_best, p_idx, n_ref, tok_ref = refs
    b = pl.program_id(0)
    lanes = res_best.shape[-1]
    valid = jnp.arange(lanes, dtype=jnp.int32) < splits

    def argmax(best_ref, idx_ref, i):
        # the smallest index among the splits attaining the max is the first split's: the
        # splits are in vocabulary order and each holds its own first argmax
        at = (b, jnp.int32(i), pl.ds(0, lanes))
        best = plgpu.load(best_ref.at[at], mask=valid, other=NEG_INF)
        m = jnp.max(best)
        idx = plgpu.load(idx_ref.at[at], mask=valid, other=0)
        return m, jnp.min(jnp.where(valid & (best == m), idx, BIG_INDEX))

    drafts, recovered, num_accepted, alive = [], [], jnp.int32(0), True
    for i in range(K):
        d = d_ref[b, i]
        at = (b, i, jnp.clip(d, 0, V - 1))       # drafts are in [0, V); never read outside
        p_at_d = p_ref[at]
        q_at_d = 1.0 if one_hot_q else q_ref[at]
        alive = alive & (u_ref[b, i] * q_at_d < p_at_d)   # accept iff u q(d) < p(d)
        num_accepted += alive.astype(jnp.int32)
        best, token = argmax(res_best, res_idx, i)
        if one_hot_q:  # the draft column's residual, left out of the pass
            score = jnp.log(jnp.maximum(p_at_d - 1.0, 0.0)) + g_ref[at]
            token = jnp.where((score > best) | ((score == best) & (d < token)), d, token)
            best = jnp.maximum(best, score)
        drafts.append(d)
        # with finite noise a score is > -inf iff its residual is > 0: the reference's
        # "the residual has mass" (else any row works, as a rejection cannot happen)
        recovered.append((best > NEG_INF, token))
    for i in range(K + 1):
        token = argmax(p_best, p_idx, i)[1]               # the bonus; the fallback when r = 0
        if i < K:
            has_mass, res_token = recovered[i]
            token = jnp.where(i < num_accepted, drafts[i], jnp.where(has_mass, res_token, token))
        plgpu.store(tok_ref.at[b, jnp.int32(i)], token)
    plgpu.store(n_ref.at[b], num_accepted)


def _sample_gpu(target_probs, draft_probs, draft_tokens, uniforms, residual_noise, *,
                interpret, block_v, num_splits):
    """Two Triton calls: the pass over the vocabulary, then `_gpu_finish_kernel`."""
    from jax.experimental.pallas import triton as plgpu

    B, K1, V = target_probs.shape
    K = K1 - 1
    stats, splits = _pass_gpu(target_probs, draft_probs, draft_tokens, residual_noise,
                              interpret=interpret, block_v=block_v, num_splits=num_splits)
    args = []
    if K:
        args = [draft_tokens.astype(jnp.int32), uniforms.astype(jnp.float32), target_probs,
                residual_noise] + ([] if draft_probs is None else [draft_probs])
    kernel = functools.partial(_gpu_finish_kernel, K=K, V=V, splits=splits,
                               one_hot_q=draft_probs is None)
    return pl.pallas_call(
        kernel, grid=(B,), interpret=interpret, name="rejection_finish_triton",
        compiler_params=plgpu.CompilerParams(num_warps=1),   # vectors of `splits` lanes at most
        out_shape=(jax.ShapeDtypeStruct((B,), jnp.int32), jax.ShapeDtypeStruct((B, K1), jnp.int32)),
    )(*args, *stats)


# ----------------------------------------------------------------------------- TPU (Mosaic)

def _tpu_kernel(d_ref, p_ref, n_ref, *rest, V, K, block_v, has_q):
    if has_q:
        q_ref, *out_refs = rest
    else:
        q_ref, out_refs = None, list(rest)
    if K:
        res_best_ref, res_idx_ref, rmax_ref, pd_ref, qd_ref, p_best_ref, p_idx_ref = out_refs
    else:
        p_best_ref, p_idx_ref = out_refs
    b = pl.program_id(0)
    v = pl.program_id(1)

    @pl.when(v == 0)
    def _init():
        p_best_ref[...] = jnp.full(p_best_ref.shape, NEG_INF, jnp.float32)
        p_idx_ref[...] = jnp.zeros(p_idx_ref.shape, jnp.int32)
        if K:
            res_best_ref[...] = jnp.full(res_best_ref.shape, NEG_INF, jnp.float32)
            res_idx_ref[...] = jnp.zeros(res_idx_ref.shape, jnp.int32)
            for ref in (rmax_ref, pd_ref, qd_ref):
                ref[...] = jnp.zeros(ref.shape, jnp.float32)

    def update(best_ref, idx_ref, scores, cols):
        m, idx = _tile_argmax(scores, cols)                  # [rows, 1]
        best = best_ref[...]                                 # [rows, 128] lane-replicated
        better = m > best
        best_ref[...] = jnp.where(better, m, best)
        idx_ref[...] = jnp.where(better, idx, idx_ref[...])

    # All K+1 rows: log p + g (bonus token, and the no-residual-mass fallback).
    shape = (K + 1, block_v)
    cols = v * block_v + lax.broadcasted_iota(jnp.int32, shape, 1)
    p = p_ref[...]
    g = n_ref[...]
    update(p_best_ref, p_idx_ref, jnp.where(cols < V, jnp.log(p) + g, NEG_INF), cols)

    if K:  # rows 0..K-1 (an offset-0 slice): residual max(p - q, 0)
        shape = (K, block_v)
        cols = v * block_v + lax.broadcasted_iota(jnp.int32, shape, 1)
        valid = cols < V
        # Draft id of each row from SMEM scalars, built on one 128-lane column, then tiled.
        rows = lax.broadcasted_iota(jnp.int32, (K, LANES), 0)
        dcol = jnp.full((K, LANES), d_ref[b * K], jnp.int32)
        for i in range(1, K):
            dcol = jnp.where(rows == i, d_ref[b * K + i], dcol)
        hit = cols == _lanes(dcol, block_v)
        pk = p_ref[pl.ds(0, K), :]
        gk = n_ref[pl.ds(0, K), :]
        qk = q_ref[...] if has_q else jnp.where(hit, 1.0, 0.0).astype(jnp.float32)
        r = jnp.maximum(pk - qk, 0.0)
        update(res_best_ref, res_idx_ref, jnp.where(valid, jnp.log(r) + gk, NEG_INF), cols)
        rmax_ref[...] = jnp.maximum(
            rmax_ref[...], jnp.max(jnp.where(valid, r, 0.0), axis=1, keepdims=True))
        pd_ref[...] += jnp.sum(jnp.where(hit, pk, 0.0), axis=1, keepdims=True)
        if has_q:
            qd_ref[...] += jnp.sum(jnp.where(hit, qk, 0.0), axis=1, keepdims=True)


def tpu_config(V, block_v=None):
    block_v = TPU_BLOCK_V if block_v is None else block_v
    if block_v >= V:
        return V, 1                        # one block equal to the full dim: always legal
    if block_v % LANES:
        raise ValueError(f"TPU block_v must be a multiple of {LANES}, got {block_v}")
    return block_v, -(-V // block_v)


def _stats_tpu(target_probs, draft_probs, draft_tokens, residual_noise, *, interpret, block_v):
    from jax.experimental.pallas import tpu as pltpu

    B, K1, V = target_probs.shape
    K = K1 - 1
    block_v, num_tiles = tpu_config(V, block_v)
    has_q = draft_probs is not None and K > 0

    tile = lambda rows: pl.BlockSpec((None, rows, block_v), lambda b, v, d: (b, 0, v))
    stat = lambda rows: pl.BlockSpec((None, rows, LANES), lambda b, v, d: (b, 0, 0))
    in_specs = [tile(K1), tile(K1)] + ([tile(K)] if has_q else [])
    f32 = lambda rows: jax.ShapeDtypeStruct((B, rows, LANES), jnp.float32)
    i32 = lambda rows: jax.ShapeDtypeStruct((B, rows, LANES), jnp.int32)
    out_shape = ([f32(K), i32(K), f32(K), f32(K), f32(K)] if K else []) + [f32(K1), i32(K1)]
    out_specs = ([stat(K)] * 5 if K else []) + [stat(K1)] * 2
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(B, num_tiles), in_specs=in_specs, out_specs=out_specs)
    kernel = functools.partial(_tpu_kernel, V=V, K=K, block_v=block_v, has_q=has_q)
    d_flat = draft_tokens.astype(jnp.int32).reshape(-1)
    if K == 0:
        d_flat = jnp.zeros((1,), jnp.int32)   # SMEM operand must be non-empty
    args = [d_flat, target_probs, residual_noise] + ([draft_probs] if has_q else [])
    outs = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_shape, interpret=interpret,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        name="rejection_sample_mosaic",
    )(*args)
    outs = [o[..., 0] for o in outs]
    if K:
        res_best, res_idx, rmax, pd, qd, p_best, p_idx = outs
        return res_idx, rmax, pd, qd, p_idx
    p_best, p_idx = outs
    empty = jnp.zeros((B, 0), jnp.float32)
    return jnp.zeros((B, 0), jnp.int32), empty, empty, empty, p_idx


# ----------------------------------------------------------------------------- entry point

def rejection_sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise, *,
                     interpret=False, platform=None, block_v=None, num_splits=None):
    """Pallas rejection sampler; same results as `rejection_sample_xla` for the same inputs.

    interpret: False, True, or (TPU variant) a `pltpu.InterpretParams`.
    platform:  "gpu" | "tpu" | None (= `jax.default_backend()`; "tpu" when interpreting on CPU).
    block_v / num_splits: vocab tile (GPU: power of two; TPU: multiple of 128) and the GPU
    vocab split factor; None picks the defaults (GPU_BLOCK_V / TPU_BLOCK_V, splits from the
    SM count).
    """
    B, K1, _ = target_probs.shape
    K = K1 - 1
    if draft_tokens.shape != (B, K) or uniforms.shape != (B, K):
        raise ValueError(f"draft_tokens/uniforms must be [B, K] = {(B, K)}, got "
                         f"{draft_tokens.shape}, {uniforms.shape}")
    platform, (target_probs, draft_probs, residual_noise) = _prepare(
        target_probs, draft_probs, residual_noise, interpret, platform)
    if platform == "gpu":
        return _sample_gpu(target_probs, draft_probs, draft_tokens, uniforms, residual_noise,
                           interpret=interpret, block_v=block_v, num_splits=num_splits)
    res_token, rmax, p_at_d, q_at_d, p_token = _stats_tpu(
        target_probs, draft_probs, draft_tokens, residual_noise, interpret=interpret,
        block_v=block_v)

    # TPU epilogue on [B, K+1] scalars (XLA): accept test, first rejection, token select.
    if draft_probs is None:
        q_at_d = jnp.ones_like(p_at_d)
    num_accepted = first_rejection(uniforms * q_at_d < p_at_d)
    recovered = jnp.where(rmax > 0, res_token, p_token[:, :K])
    sampled = jnp.concatenate([recovered, p_token[:, K:]], axis=1).astype(jnp.int32)
    if K == 0:  # plain decoding: the bonus token only
        return num_accepted, sampled
    padded_drafts = jnp.concatenate([draft_tokens, draft_tokens[:, :1]], axis=1).astype(jnp.int32)
    pos = jnp.arange(K + 1)[None, :]
    tokens = jnp.where(pos < num_accepted[:, None], padded_drafts, sampled)
    return num_accepted, tokens


def vocab_pass(target_probs, draft_probs, draft_tokens, residual_noise, *, interpret=False,
               platform=None, block_v=None, num_splits=None):
    """The pass over the vocabulary alone, arguments as `rejection_sample`'s: what the device
    check times as the kernel, beside the whole sampler. Returns its raw statistics: on a GPU
    the four [B, K+1, next_pow2(splits)] partials of `_gpu_kernel` (unmerged, entries past
    the splits unwritten; `_gpu_finish_kernel` merges them), on a TPU the merged per-row
    statistics of `_stats_tpu`."""
    platform, (target_probs, draft_probs, residual_noise) = _prepare(
        target_probs, draft_probs, residual_noise, interpret, platform)
    if platform == "gpu":
        return _pass_gpu(target_probs, draft_probs, draft_tokens, residual_noise,
                         interpret=interpret, block_v=block_v, num_splits=num_splits)[0]
    return _stats_tpu(target_probs, draft_probs, draft_tokens, residual_noise,
                      interpret=interpret, block_v=block_v)


def _prepare(target_probs, draft_probs, residual_noise, interpret, platform):
    """Checks the vocabulary-sized inputs and casts them to float32 (a no-op for the
    engine's float32 probabilities); returns (the variant to build, the inputs)."""
    B, K1, V = target_probs.shape
    if residual_noise.shape != target_probs.shape:
        raise ValueError(f"residual_noise {residual_noise.shape} != target_probs "
                         f"{target_probs.shape}")
    if draft_probs is not None and draft_probs.shape != (B, K1 - 1, V):
        raise ValueError(f"draft_probs must be [B, K, V] = {(B, K1 - 1, V)}, got "
                         f"{draft_probs.shape}")
    platform = resolve_platform(platform, interpret)
    if platform == "gpu" and interpret not in (True, False):
        raise ValueError("InterpretParams are for the TPU variant; use interpret=True")
    f32 = lambda x: None if x is None else x.astype(jnp.float32)
    return platform, (f32(target_probs), f32(draft_probs), f32(residual_noise))
