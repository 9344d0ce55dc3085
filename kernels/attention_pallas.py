"""Pallas verify attention: T = K+1 new queries per sequence against its KV cache.

Same contract as `attention_ref.verify_attention_xla` (read its docstring): q
[B, T, Hq, D], caches [N, Hkv, S, D] (the whole head-major buffer, N >= B),
q_positions [B, T], rows [B] (cache row of each batch row; None = 0..B-1); query
(b, t) sees entries 0..q_positions[b, t] of cache row rows[b]. The kernels address
cache row rows[b] in place: nothing in front of them slices or gathers whole cache
rows (that would copy the cache's capacity every layer). Softmax in float32, output in
q's dtype. A query whose position is < 0 sees nothing and gets NaN, exactly like
the reference (the models clamp positions to >= 0, so this never happens there).

Both variants share one layout trick: the T new tokens of a sequence and the
`group = Hq // Hkv` query heads that share a KV head form R = T * group query
rows against ONE stream of K/V blocks, so each KV byte is read once per
(sequence, kv head) whatever T and the GQA ratio are (flash-decoding with the
query rows packed into the matmul's M dimension). Row r is token r // group,
head r % group; rows are padded up to a hardware-friendly R_pad.

Only the blocks below `lengths[b] = max_t q_positions[b, t] + 1` are read:

* GPU (Pallas Triton): grid (B, Hkv, row tiles * splits). K/V blocks span all N cache rows
  (block = full dim) and program b loads rows[b] (a per-b int32 block, like
  `lengths`) to address `k_ref.at[rows[b], pl.ds(start, block_k)]`. Each program
  walks its share of the *live* KV blocks of its sequence in a `fori_loop` with
  dynamic bounds (split-K flash-decoding, the live blocks are divided evenly
  between splits so short and long sequences both fill the SMs); masked loads
  (`other=0`) so a cache length that is not a block multiple is safe. Partial
  (acc, m, l) per split are merged by a tiny XLA epilogue; splits ~ one wave of
  programs over the SMs (1 once B * Hkv * row tiles >= #SMs). Block shapes are powers
  of two (Triton): R_pad = max(16, next_pow2(R)) (tl.dot needs M >= 16), cut into row
  tiles of at most 128 rows (a decode step, T <= 9 with group <= 8, is one tile; a
  prefill or catch-up chunk is several, each reading only the KV its last row sees:
  a whole chunk in one program overflows an H100's shared memory), block_k = 128 (64
  when the row tile is >= 128, to bound registers; float32 tiles are smaller, see
  `gpu_config`), head_dim 64/128.
* TPU (Pallas Mosaic): grid (B, Hkv, cdiv(S, block_k)) with `lengths`, the
  positions and `rows` scalar-prefetched into SMEM (`PrefetchScalarGridSpec`). The
  K/V index_map picks block (rows[b], h, j, 0) with j clamped to the last live
  block, so the pipeline issues no DMA for blocks past the length (same block
  index => no new copy) and `pl.when` skips their compute. A row's position is built
  from the SMEM scalars for T <= 16; longer chunks load it, lane-replicated, from VMEM. Online-softmax state lives in VMEM scratch
  (m, l as [R_pad, 128] lane-replicated like the official flash kernel). Blocks
  respect the (8, 128) tiling: R_pad is a multiple of 8 (f32) / 16 (bf16),
  block_k = 512 (or S when S <= 512: a block equal to the full dim is legal),
  head_dim is the full last dim.

`platform` picks the variant ("gpu" | "tpu"; default `jax.default_backend()`, or
"tpu" when interpreting on a CPU host), `interpret=True` (or a
`pltpu.InterpretParams`, TPU variant only) runs it in the Pallas interpreter, so
both variants are testable on CPU. Byte/FLOP floors: ROOFLINE.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

NEG_INF = float("-inf")
TPU_BLOCK_K = 512
# TPU: up to this many new tokens, each row's position is built from SMEM scalars (T
# unrolled compares per KV block); longer chunks (prefill, catch-up) load it from VMEM.
SMEM_ROWPOS_MAX_T = 16
DEFAULT_GPU_SMS = 132  # H100 SXM; used when no GPU is attached (lowering from CPU)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def resolve_platform(platform: str | None, interpret=False) -> str:
    """"gpu" | "tpu": the Pallas variant to build.

    Explicit `platform` wins ("cuda"/"rocm" mean "gpu"); otherwise the default backend;
    interpreting on a CPU host with no platform given runs the TPU variant.
    """
    if platform is None:
        platform = jax.default_backend()
        if platform not in ("gpu", "tpu") and interpret is not False:
            platform = "tpu"
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
    if platform not in ("gpu", "tpu"):
        raise ValueError(
            f"no Pallas variant for platform {platform!r}: pass platform='gpu' or 'tpu' "
            "(with interpret=True to run it on CPU), or use the XLA reference (a SpecEngine: "
            "backend='interpret' runs the Pallas kernels interpreted on CPU, slow; 'xla' or 'auto' "
            "the XLA reference)")
    return platform


def _dot_precision(dtype):
    # float32 inputs: full-precision MXU/tensor-core passes (Triton would use TF32 by default).
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def _to_rows(q, hkv, r_pad):
    """[B, T, Hq, D] -> [B, Hkv, R_pad, D], row = t * group + g (zero-padded rows)."""
    B, T, Hq, D = q.shape
    group = Hq // hkv
    qr = q.reshape(B, T, hkv, group, D).transpose(0, 2, 1, 3, 4).reshape(B, hkv, T * group, D)
    return jnp.pad(qr, ((0, 0), (0, 0), (0, r_pad - T * group), (0, 0)))


def _from_rows(o, T, group):
    B, hkv, _, D = o.shape
    o = o[:, :, :T * group].reshape(B, hkv, T, group, D).transpose(0, 2, 1, 3, 4)
    return o.reshape(B, T, hkv * group, D)


# ----------------------------------------------------------------------------- GPU (Triton)

def _gpu_kernel(len_ref, row_ref, pos_ref, q_ref, k_ref, v_ref, *out_refs, block_k, splits,
                scale, prec):
    from jax.experimental.pallas import triton as plgpu

    j = lax.rem(pl.program_id(2), splits)  # axis 2 is (row tile, split)
    length = len_ref[()]                # KV entries this row tile sees (its last position + 1)
    row = row_ref[()]                   # cache row rows[b]; k_ref, v_ref: [N, S, D]
    num_blocks = lax.div(length + block_k - 1, block_k)      # non-negative: truncating div
    lo = lax.div(j * num_blocks, splits)
    hi = lax.div((j + 1) * num_blocks, splits)

    q = q_ref[...]                      # [row_tile, D]
    rowpos = pos_ref[...]               # [row_tile] int32
    r_pad, d = q.shape
    offs = jnp.arange(block_k, dtype=jnp.int32)

    def body(i, carry):
        acc, m, l = carry
        start = pl.multiple_of(i * block_k, block_k)
        cols = start + offs
        live = (cols < length)[:, None]
        k = plgpu.load(k_ref.at[row, pl.ds(start, block_k), :], mask=live, other=0.0)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=prec,
                            preferred_element_type=jnp.float32) * scale
        s = jnp.where(cols[None, :] <= rowpos[:, None], s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)   # fully masked row: keep p = 0, no NaN
        alpha = jnp.exp(m - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        l = alpha * l + jnp.sum(p, axis=1)
        v = plgpu.load(v_ref.at[row, pl.ds(start, block_k), :], mask=live, other=0.0)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=prec,
                             preferred_element_type=jnp.float32)
        return acc * alpha[:, None] + pv, m_new, l

    init = (jnp.zeros((r_pad, d), jnp.float32), jnp.full((r_pad,), NEG_INF, jnp.float32),
            jnp.zeros((r_pad,), jnp.float32))
    acc, m, l = lax.fori_loop(lo, hi, body, init)
    if splits == 1:
        (o_ref,) = out_refs
        # l == 0 only for a position < 0: NaN, like the reference.
        plgpu.store(o_ref, (acc / l[:, None]).astype(o_ref.dtype))
    else:
        for ref, val in zip(out_refs, (acc, m, l)):
            plgpu.store(ref, val)


def _gpu_num_sms() -> int:
    try:
        return int(jax.devices("gpu")[0].core_count)
    except Exception:  # no GPU attached (lowering from CPU) or attribute missing
        return DEFAULT_GPU_SMS


class GpuTiling(NamedTuple):
    """Static tiling of the Triton variant (all powers of two but splits)."""
    r_pad: int      # query rows padded: T * group rounded up
    row_tile: int   # query rows per program (r_pad // row_tile row tiles)
    block_k: int    # KV entries per loop step
    splits: int     # split-K programs per row tile
    num_warps: int


# Query rows per program. A program holds its [row_tile, D] queries, the f32 accumulator
# and a [row_tile, block_k] score tile on chip. Compiled for sm_90 (Triton 3.9 + ptxas, from
# the lowered kernels; kernels/ROOFLINE.md): a 128-row tile at block_k 64, D = 128, bf16
# takes 96 KiB of shared memory and no spills, while a whole 256-token prefill chunk in one
# program (1024 rows at GQA 4) takes 320 KiB, over the 227 KiB an H100 block may have.
MAX_ROW_TILE = 128
# float32 runs its dots on the FMA units (HIGHEST precision), not tensor cores: past
# row_tile * block_k * D = 2**17 elements the registers spill (kilobytes per thread).
F32_TILE_ELEMENTS = 1 << 17


def gpu_config(B, T, Hq, Hkv, S, D, num_splits=None, block_k=None, row_tile=None,
               dtype=jnp.bfloat16) -> GpuTiling:
    """Static tiling for the Triton variant (see `GpuTiling`)."""
    r = T * (Hq // Hkv)
    r_pad = max(16, _next_pow2(r))
    f32 = jnp.dtype(dtype).itemsize >= 4
    if row_tile is None:
        row_tile = max(16, min(MAX_ROW_TILE, F32_TILE_ELEMENTS // (32 * D))) if f32 else MAX_ROW_TILE
    if row_tile < 16 or row_tile & (row_tile - 1):
        raise ValueError(f"Triton row_tile must be a power of two >= 16, got {row_tile}")
    row_tile = min(row_tile, r_pad)
    tiles = r_pad // row_tile
    if block_k is None:
        if f32:
            block_k = max(16, min(128, F32_TILE_ELEMENTS // (row_tile * D)))
        else:
            block_k = 128 if row_tile <= 64 else 64
    if block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"Triton block_k must be a power of two >= 16, got {block_k}")
    num_warps = 8 if f32 or row_tile > 32 else 4
    if num_splits is None:
        # About one wave of programs on the SMs (split-K only while B * Hkv * tiles < #SMs),
        # at least 2 KV blocks per split at full S. A split's f32 partials, written and read
        # back by the merge, cost 2 * R_pad * (D + 2) * 4 bytes (see ROOFLINE.md): worth it
        # at small B, where too few programs cannot pull the HBM bandwidth.
        want = -(-_gpu_num_sms() // (B * Hkv * tiles))
        cap = max(1, (-(-S // block_k)) // 2)
        num_splits = max(1, min(want, cap, 16))
    return GpuTiling(r_pad, row_tile, block_k, int(num_splits), num_warps)


def _verify_attention_gpu(q, k_cache, v_cache, q_positions, rows, *, interpret,
                          num_splits=None, block_k=None, row_tile=None):
    from jax.experimental.pallas import triton as plgpu

    B, T, Hq, D = q.shape
    N, Hkv, S = k_cache.shape[:3]
    group = Hq // Hkv
    if D & (D - 1):
        raise ValueError(f"Triton verify attention needs a power-of-two head_dim, got {D}")
    r_pad, rt, block_k, splits, num_warps = gpu_config(B, T, Hq, Hkv, S, D, num_splits, block_k,
                                                       row_tile, q.dtype)
    tiles = r_pad // rt

    pos = jnp.minimum(q_positions.astype(jnp.int32), S - 1)
    rowpos = jnp.repeat(pos, group, axis=1)                                   # [B, T*group]
    rowpos = jnp.pad(rowpos, ((0, 0), (0, r_pad - T * group)), mode="edge")  # pad rows: finite
    # per row tile: the KV entries its rows see (a causal prefill's early tiles read less)
    lengths = jnp.clip(jnp.max(rowpos.reshape(B, tiles, rt), axis=2) + 1, 0, S).astype(jnp.int32)
    qr = _to_rows(q, Hkv, r_pad)

    kernel = functools.partial(_gpu_kernel, block_k=block_k, splits=splits,
                               scale=D ** -0.5, prec=_dot_precision(q.dtype))
    # grid axis 2 folds (row tile t, split j) as t * splits + j: Triton grids have 3 axes
    in_specs = [
        pl.BlockSpec((None, None), lambda b, h, p: (b, p // splits)),
        pl.BlockSpec((None,), lambda b, h, p: (b,)),
        pl.BlockSpec((None, rt), lambda b, h, p: (b, p // splits)),
        pl.BlockSpec((None, None, rt, D), lambda b, h, p: (b, h, p // splits, 0)),
        pl.BlockSpec((N, None, S, D), lambda b, h, p: (0, h, 0, 0)),   # all rows: the kernel
        pl.BlockSpec((N, None, S, D), lambda b, h, p: (0, h, 0, 0)),   # picks rows[b]
    ]
    if splits == 1:
        out_shape = jax.ShapeDtypeStruct((B, Hkv, r_pad, D), q.dtype)
        out_specs = pl.BlockSpec((None, None, rt, D), lambda b, h, p: (b, h, p, 0))
    else:
        out_shape = (jax.ShapeDtypeStruct((B, Hkv, splits, r_pad, D), jnp.float32),
                     jax.ShapeDtypeStruct((B, Hkv, splits, r_pad), jnp.float32),
                     jax.ShapeDtypeStruct((B, Hkv, splits, r_pad), jnp.float32))
        out_specs = (
            pl.BlockSpec((None, None, None, rt, D), lambda b, h, p: (b, h, p % splits, p // splits, 0)),
            pl.BlockSpec((None, None, None, rt), lambda b, h, p: (b, h, p % splits, p // splits)),
            pl.BlockSpec((None, None, None, rt), lambda b, h, p: (b, h, p % splits, p // splits)))
    out = pl.pallas_call(
        kernel, grid=(B, Hkv, tiles * splits), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, interpret=interpret, name="verify_attention_triton",
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
    )(lengths, rows, rowpos, qr, k_cache, v_cache)
    if splits == 1:
        o = out
    else:  # merge the split-K partials (tiny: B*Hkv*splits*R_pad*(D+2) floats)
        acc, m, l = out
        m_max = jnp.max(m, axis=2, keepdims=True)
        m_safe = jnp.where(m_max == NEG_INF, 0.0, m_max)
        w = jnp.exp(m - m_safe)                                  # [B, Hkv, splits, R_pad]
        l_tot = jnp.sum(w * l, axis=2)
        o = (jnp.sum(w[..., None] * acc, axis=2) / l_tot[..., None]).astype(q.dtype)
    return _from_rows(o, T, group)


# ----------------------------------------------------------------------------- TPU (Mosaic)

def _tpu_kernel(len_ref, pos_ref, row_ref, q_ref, k_ref, v_ref, *refs, block_k, T, group, S,
                scale, prec):
    # refs: ([rowpos_ref] when T > SMEM_ROWPOS_MAX_T), o_ref, then the m, l, acc scratch
    *rowpos_ref, o_ref, m_sc, l_sc, acc_sc = refs
    b = pl.program_id(0)
    j = pl.program_id(2)
    r_pad, d = acc_sc.shape

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, NEG_INF, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    length = len_ref[b]

    @pl.when(j * block_k < length)
    def _step():
        q = q_ref[...]                                           # [R_pad, D]
        k = k_ref[...]                                           # [block_k, D]
        v = v_ref[...]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=prec,
                            preferred_element_type=jnp.float32) * scale   # [R_pad, block_k]
        if rowpos_ref:  # a prefill chunk: its rows' positions, lane-replicated in VMEM
            rowpos = rowpos_ref[0][...]
        else:
            # Row r is token r // group: build its position from SMEM scalars with compares
            # only (no vector integer division; T static and small), on one 128-lane column.
            rows = lax.broadcasted_iota(jnp.int32, (r_pad, 128), 0)
            rowpos = jnp.full((r_pad, 128), pos_ref[b * T], jnp.int32)
            for t in range(1, T):
                rowpos = jnp.where(rows >= t * group, pos_ref[b * T + t], rowpos)
        cols = j * block_k + lax.broadcasted_iota(jnp.int32, (r_pad, block_k), 1)
        s = jnp.where(cols <= _lanes(rowpos, block_k), s, NEG_INF)

        m_prev = m_sc[...]                                       # [R_pad, 128] lane-replicated
        l_prev = l_sc[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        m_safe = jnp.where(m_next == NEG_INF, 0.0, m_next)
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - _lanes(m_safe, block_k))
        l_sc[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        m_sc[...] = m_next
        if S % block_k:  # partial last block: rows past S are unspecified memory (0 * NaN = NaN)
            vrow = j * block_k + lax.broadcasted_iota(jnp.int32, v.shape, 0)
            v = jnp.where(vrow < S, v, jnp.zeros_like(v))
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=prec,
                             preferred_element_type=jnp.float32)
        acc_sc[...] = acc_sc[...] * _lanes(alpha, d) + pv

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = (acc_sc[...] / _lanes(l_sc[...], d)).astype(o_ref.dtype)


def _lanes(x, n):
    """[R, 128] lane-replicated -> [R, n]: a slice, whole-vreg copies (the official flash
    kernel's pattern) for multiples of 128, else a lane broadcast of column 0."""
    if n <= x.shape[1]:
        return x[:, :n]
    if n % x.shape[1] == 0:
        return jnp.tile(x, (1, n // x.shape[1]))
    return jnp.broadcast_to(x[:, :1], (x.shape[0], n))


def tpu_config(T, Hq, Hkv, S, dtype, block_k=None):
    """Static tiling for the Mosaic variant: (r_pad, block_k)."""
    r = T * (Hq // Hkv)
    sublanes = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)   # f32: 8, bf16: 16
    r_pad = _round_up(r, sublanes)
    block_k = TPU_BLOCK_K if block_k is None else block_k
    if block_k >= S:
        block_k = S                      # one block equal to the full dim: always legal
    elif block_k % 128:
        raise ValueError(f"TPU block_k must be a multiple of 128 (or >= S), got {block_k}")
    return r_pad, block_k


def _verify_attention_tpu(q, k_cache, v_cache, q_positions, rows, *, interpret, block_k=None):
    from jax.experimental.pallas import tpu as pltpu

    B, T, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    r_pad, block_k = tpu_config(T, Hq, Hkv, S, q.dtype, block_k)
    num_kv = pl.cdiv(S, block_k)

    pos = jnp.minimum(q_positions.astype(jnp.int32), S - 1)
    lengths = jnp.clip(jnp.max(pos, axis=1) + 1, 0, S).astype(jnp.int32)
    qr = _to_rows(q, Hkv, r_pad)

    def q_map(b, h, j, len_ref, pos_ref, row_ref):
        return (b, h, 0, 0)

    def kv_map(b, h, j, len_ref, pos_ref, row_ref):
        last = jnp.maximum(pl.cdiv(len_ref[b], block_k) - 1, 0)
        return (row_ref[b], h, jnp.minimum(j, last), 0)

    kernel = functools.partial(_tpu_kernel, block_k=block_k, T=T, group=group, S=S,
                               scale=D ** -0.5, prec=_dot_precision(q.dtype))
    in_specs = [pl.BlockSpec((None, None, r_pad, D), q_map),
                pl.BlockSpec((None, None, block_k, D), kv_map),
                pl.BlockSpec((None, None, block_k, D), kv_map)]
    operands = [qr, k_cache, v_cache]
    if T > SMEM_ROWPOS_MAX_T:  # unrolling T compares per KV block would cost more than a load
        rowpos = jnp.pad(jnp.repeat(pos, group, axis=1), ((0, 0), (0, r_pad - T * group)),
                         mode="edge")
        operands.append(jnp.broadcast_to(rowpos[:, :, None], (B, r_pad, 128)))
        in_specs.append(pl.BlockSpec((None, r_pad, 128), lambda b, h, j, *_: (b, 0, 0)))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(B, Hkv, num_kv),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, None, r_pad, D), q_map),
        scratch_shapes=[pltpu.VMEM((r_pad, 128), jnp.float32),
                        pltpu.VMEM((r_pad, 128), jnp.float32),
                        pltpu.VMEM((r_pad, D), jnp.float32)],
    )
    o = pl.pallas_call(
        kernel, grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((B, Hkv, r_pad, D), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret, name="verify_attention_mosaic",
    )(lengths, pos.reshape(-1), rows, *operands)
    return _from_rows(o, T, group)


# ----------------------------------------------------------------------------- entry point

def verify_attention(q, k_cache, v_cache, q_positions, rows=None, *, interpret=False,
                     platform=None, block_k=None, num_splits=None, row_tile=None):
    """Pallas verify attention; see the module docstring and `verify_attention_xla`.

    rows:      None (batch row b reads cache row b) or int32 [B] cache-row indices in [0, N).
    interpret: False, True, or (TPU variant) a `pltpu.InterpretParams`.
    platform:  "gpu" | "tpu" | None (= `jax.default_backend()`; "tpu" when interpreting on CPU).
    block_k:   KV block (GPU: power of two >= 16, default 128/64; TPU: multiple of 128,
               default 512, or >= S for one full block).
    num_splits: GPU split-K factor (None: from the SM count and shapes).
    row_tile:  GPU query rows per program (power of two >= 16; default min(R_pad, 128), or
               fewer in float32 so its registers do not spill; see `gpu_config`).
    """
    B, T, Hq, D = q.shape
    if k_cache.ndim != 4 or k_cache.shape != v_cache.shape or k_cache.shape[0] < B \
            or k_cache.shape[3] != D:
        raise ValueError(f"caches must be [N >= B, Hkv, S, D]; got q {q.shape}, "
                         f"k {k_cache.shape}, v {v_cache.shape}")
    if Hq % k_cache.shape[1]:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={k_cache.shape[1]}")
    if q_positions.shape != (B, T):
        raise ValueError(f"q_positions must be [B, T] = {(B, T)}, got {q_positions.shape}")
    rows = jnp.arange(B) if rows is None else rows
    rows = jnp.asarray(rows, jnp.int32)
    if rows.shape != (B,):
        raise ValueError(f"rows must be [B] = {(B,)}, got {rows.shape}")
    platform = resolve_platform(platform, interpret)
    if platform == "gpu":
        if interpret not in (True, False):
            raise ValueError("InterpretParams are for the TPU variant; use interpret=True")
        return _verify_attention_gpu(q, k_cache, v_cache, q_positions, rows,
                                     interpret=interpret, num_splits=num_splits, block_k=block_k,
                                     row_tile=row_tile)
    return _verify_attention_tpu(q, k_cache, v_cache, q_positions, rows, interpret=interpret,
                                 block_k=block_k)
