"""Pallas kernels vs their XLA references (interpret mode), and real lowering to GPU/TPU.

Interpret mode checks the numbers on CPU; it accepts ops that Triton and Mosaic
reject, so every kernel is also lowered for ("cuda",) and ("tpu",) from this CPU
host at the real model shapes (abstract `ShapeDtypeStruct` args, nothing allocated),
and the Triton module embedded in the CUDA lowering is parsed back and run through
the MLIR verifier (Triton's op verifiers: power-of-two tensors, dot shapes, ...).
"""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsd_jax import kernels
from dsd_jax.kernels import attention_pallas, rejection_pallas
from dsd_jax.kernels.attention_ref import verify_attention_xla
from dsd_jax.kernels.rejection_ref import rejection_sample_xla
from dsd_jax.device_check import cache_rows, query_positions, rejection_inputs  # device_check's cases on a GPU
from lowering import lower_for  # tests/lowering.py: jax >= 0.11 needs an abstract GPU to lower for

F32, BF16 = jnp.float32, jnp.bfloat16
TOL = {F32: 1e-5, BF16: 1e-2}


# ----------------------------------------------------------------------------- attention

def _attn_inputs(seed, B, T, Hq, Hkv, S, D, dtype, kinds, N=None):
    """Caches hold N >= B rows (default B + 2): the rows no batch row reads are noise too."""
    rng = np.random.default_rng(seed)
    N = B + 2 if N is None else N
    q = jnp.asarray(rng.standard_normal((B, T, Hq, D)), dtype)
    k = jnp.asarray(rng.standard_normal((N, Hkv, S, D)), dtype)
    v = jnp.asarray(rng.standard_normal((N, Hkv, S, D)), dtype)
    return q, k, v, query_positions(rng, B, T, S, kinds)


def _rel_err(out, ref):
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))   # NaN exactly where the ref has it
    ok = ~np.isnan(ref)
    return float(np.max(np.abs(out[ok] - ref[ok])) / np.max(np.abs(ref[ok])))


# (platform, B, T, Hq, Hkv, S, D, dtype, block_k, num_splits, row kinds): GQA ratios 1, 2, 4,
# 7, 8; T 1..9; head_dim 64/128; S not a block multiple (ragged last block); GPU split-K.
ATTN_CASES = [
    ("gpu", 3, 1, 4, 4, 40, 64, F32, None, None, ("one", "full", "odd")),
    ("gpu", 4, 5, 28, 4, 200, 128, F32, 64, 3, ("odd", "one", "full", "pad")),
    ("gpu", 3, 9, 16, 2, 77, 128, BF16, 32, 2, ("full", "odd", "neg")),
    ("gpu", 3, 3, 8, 4, 50, 64, BF16, 16, None, ("pad", "one", "odd")),
    ("gpu", 2, 2, 32, 8, 129, 64, F32, 32, 4, ("odd", "full")),
    ("gpu", 2, 40, 16, 4, 300, 128, BF16, None, None, ("full", "odd")),  # 2 row tiles, split-K
    ("tpu", 3, 1, 4, 4, 40, 64, F32, None, None, ("one", "full", "odd")),
    ("tpu", 4, 5, 28, 4, 300, 128, F32, None, None, ("odd", "one", "full", "pad")),
    ("tpu", 3, 9, 16, 2, 260, 128, BF16, 128, None, ("full", "odd", "neg")),
    ("tpu", 3, 4, 16, 4, 64, 64, BF16, None, None, ("pad", "one", "odd")),
    ("tpu", 2, 7, 16, 8, 256, 64, F32, 128, None, ("odd", "full")),
    ("tpu", 2, 20, 8, 2, 300, 64, F32, 128, None, ("full", "odd")),  # positions from VMEM
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "{}-T{}-Hq{}-Hkv{}-S{}-D{}-{}".format(
    c[0], c[2], c[3], c[4], c[5], c[6], jnp.dtype(c[7]).name))
def test_verify_attention_interpret_matches_reference(case):
    platform, B, T, Hq, Hkv, S, D, dtype, block_k, num_splits, kinds = case
    q, k, v, pos = _attn_inputs(zlib.crc32(repr(case).encode()), B, T, Hq, Hkv, S, D, dtype, kinds)
    rows = cache_rows(B, k.shape[0])
    ref = verify_attention_xla(q, k, v, pos, rows)
    out = attention_pallas.verify_attention(q, k, v, pos, rows, interpret=True, platform=platform,
                                            block_k=block_k, num_splits=num_splits)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert _rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("row_tile, splits", [(16, None), (32, 3), (128, 1)])
def test_verify_attention_gpu_row_tiles(row_tile, splits):
    """A prefill-sized chunk on the Triton variant: each row tile reads only the KV its last
    row sees (the tiles' lengths differ), and any tiling gives the reference's output."""
    q, k, v, pos = _attn_inputs(11, 2, 16, 8, 2, 90, 64, F32, ("full", "odd"))
    pos = pos.at[1].set(jnp.arange(16) + 30)  # causal chunk: row tiles see 31.. 46 entries
    rows = cache_rows(2, k.shape[0])
    out = attention_pallas.verify_attention(q, k, v, pos, rows, interpret=True, platform="gpu",
                                            block_k=16, num_splits=splits, row_tile=row_tile)
    assert _rel_err(out, verify_attention_xla(q, k, v, pos, rows)) < TOL[F32]


def test_gpu_tiling_bounds_every_program_at_real_shapes():
    """Whatever the chunk (decode T <= 9 up to a 256-token prefill chunk) and the GQA ratio,
    a Triton program holds at most MAX_ROW_TILE query rows (more overflows an H100's shared
    memory at head_dim 128) and every block is a power of two."""
    for hq, hkv in [(32, 8), (28, 4), (16, 2), (14, 2), (32, 32)]:
        for T in (1, 5, 9, 16, 64, 256):
            for dtype, D in [(BF16, 128), (F32, 128), (F32, 64)]:
                t = attention_pallas.gpu_config(8, T, hq, hkv, 8201, D, dtype=dtype)
                assert 16 <= t.row_tile <= attention_pallas.MAX_ROW_TILE
                assert t.r_pad % t.row_tile == 0 and t.r_pad >= T * (hq // hkv)
                if dtype == F32:  # FMA dots: a tile small enough not to spill registers
                    assert t.row_tile * t.block_k * D <= attention_pallas.F32_TILE_ELEMENTS
                    assert t.num_warps == 8
                else:
                    assert t.block_k == (64 if t.row_tile >= 128 else 128)
                for n in (t.r_pad, t.row_tile, t.block_k):
                    assert n & (n - 1) == 0
    with pytest.raises(ValueError, match="row_tile"):
        attention_pallas.gpu_config(1, 1, 8, 2, 64, 64, row_tile=24)


def test_reference_rows():
    """The oracle itself: rows=None is rows 0..B-1, and rows[b] selects what batch row b sees."""
    q, k, v, pos = _attn_inputs(5, 3, 2, 4, 2, 30, 64, F32, ("odd", "full", "one"), N=5)
    rows = cache_rows(3, 5)
    np.testing.assert_array_equal(verify_attention_xla(q, k, v, pos),
                                  verify_attention_xla(q, k[:3], v[:3], pos, jnp.arange(3)))
    np.testing.assert_array_equal(verify_attention_xla(q, k, v, pos, rows),
                                  verify_attention_xla(q, k[rows], v[rows], pos))


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_verify_attention_rows_none_reads_first_rows(platform):
    """rows=None with N > B: batch row b reads cache row b (rows B..N-1 are never read)."""
    q, k, v, pos = _attn_inputs(9, 3, 3, 8, 2, 140, 64, F32, ("odd", "full", "pad"), N=6)
    ref = verify_attention_xla(q, k[:3], v[:3], pos)
    out = attention_pallas.verify_attention(q, k, v, pos, interpret=True, platform=platform,
                                            block_k=64 if platform == "gpu" else 128)
    assert _rel_err(out, ref) < 1e-5


def test_verify_attention_tpu_interpreter_uninitialized_memory():
    """The TPU interpreter fills reads past the array (the ragged last KV block) with NaN,
    as unspecified memory on a real TPU may be: the kernel must mask them out."""
    from jax.experimental.pallas import tpu as pltpu
    q, k, v, pos = _attn_inputs(7, 2, 3, 4, 2, 300, 64, F32, ("full", "odd"))
    params = pltpu.InterpretParams(out_of_bounds_reads="uninitialized", uninitialized_memory="nan")
    rows = cache_rows(2, k.shape[0])
    out = attention_pallas.verify_attention(q, k, v, pos, rows, interpret=params, platform="tpu",
                                            block_k=128)
    assert _rel_err(out, verify_attention_xla(q, k, v, pos, rows)) < 1e-5


def test_verify_attention_dispatch():
    q, k, v, pos = _attn_inputs(3, 2, 2, 4, 2, 24, 64, F32, ("odd", "full"))
    rows = cache_rows(2, k.shape[0])
    ref = kernels.verify_attention(q, k, v, pos, rows, backend="xla")
    out = jax.jit(functools.partial(kernels.verify_attention, backend="interpret"))(q, k, v, pos,
                                                                                    rows)
    assert _rel_err(out, ref) < 1e-5
    if jax.default_backend() == "cpu":
        with pytest.raises(ValueError, match="no Pallas variant.*a SpecEngine: backend='interpret'"):
            kernels.verify_attention(q, k, v, pos, backend="pallas")


# (B, T, S, block, permuted rows): many blocks, the last overlapping the one before when S
# is no block multiple; a block as long as the buffer is clamped below it.
XLA_CACHE_CASES = [
    (3, 1, 300, 16, True),
    (3, 1, 40, 48, False),
    (2, 1, 20, 32, True),
    (3, 4, 100, 16, True),
    (2, 3, 37, 8, False),
]


@pytest.mark.parametrize("case", XLA_CACHE_CASES, ids=lambda c: "B{}-T{}-S{}-blk{}".format(*c[:4]))
def test_attend_and_write_xla_matches_reference(case):
    """The blocked XLA path (write inside the loop, online softmax over blocks) against
    writing the entries and attending over the whole cache."""
    from dsd_jax.kernels import attend_and_write_xla, write_entries
    B, T, S, block, permuted = case
    q, k, v, pos = _attn_inputs(11, B, T, 8, 2, S, 64, F32, ("odd", "full", "one"))
    rng = np.random.default_rng(12)
    k_new, v_new = (jnp.asarray(rng.standard_normal((B, T, 2, 64)), F32) for _ in range(2))
    rows = jnp.asarray(rng.permutation(B + 2)[:B], jnp.int32) if permuted else None
    idx = jnp.arange(B, dtype=jnp.int32) if rows is None else rows
    out, kc, vc = jax.jit(functools.partial(attend_and_write_xla, block=block))(
        q, k_new, v_new, pos, k, v, rows)
    k_ref, v_ref = write_entries(k, k_new, idx, pos), write_entries(v, v_new, idx, pos)
    np.testing.assert_array_equal(kc, k_ref)
    np.testing.assert_array_equal(vc, v_ref)
    assert _rel_err(out, verify_attention_xla(q, k_ref, v_ref, pos, rows)) < 1e-5


# ----------------------------------------------------------------------------- rejection

def _assert_same_tokens(args, platform, **kw):
    n_ref, t_ref = rejection_sample_xla(*args)
    n, t = rejection_pallas.rejection_sample(*args, interpret=True, platform=platform, **kw)
    np.testing.assert_array_equal(np.asarray(n), np.asarray(n_ref))
    np.testing.assert_array_equal(np.asarray(t), np.asarray(t_ref))
    return np.asarray(n_ref)


# (B, K, V, one-hot q, greedy rows, p == q rows, block_v, GPU splits); V never a tile multiple.
REJ_CASES = [
    (6, 4, 1000, False, (1,), (2,), 256, 3),
    (6, 3, 700, True, (0, 4), (), 128, 2),
    (3, 8, 520, False, (), (1,), 128, None),
    (2, 1, 151936, False, (1,), (), None, None),     # real vocab, default tiles
]


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@pytest.mark.parametrize("case", REJ_CASES, ids=lambda c: "B{}-K{}-V{}{}".format(
    c[0], c[1], c[2], "-onehotq" if c[3] else ""))
def test_rejection_interpret_token_identical(case, platform):
    B, K, V, one_hot_q, greedy, equal, block_v, splits = case
    args = rejection_inputs(B * 1000 + K * 10 + V, B, K, V, one_hot_q=one_hot_q,
                             greedy_rows=greedy, equal_rows=equal)
    kw = dict(block_v=block_v)
    if platform == "gpu":
        kw["num_splits"] = splits
    _assert_same_tokens(args, platform, **kw)


def test_rejection_acceptance_counts_vary():
    """The random cases above really exercise accepts and rejects at every position."""
    args = rejection_inputs(0, 32, 4, 300)
    n, _ = rejection_sample_xla(*args)
    assert len(set(np.asarray(n).tolist())) >= 4


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_rejection_ties_break_to_first_index(platform):
    """Zero noise and equal probabilities: argmax must pick the first maximal index, also
    when the tied entries sit in different vocab tiles and different GPU splits."""
    B, K, V = 2, 2, 600
    p = np.zeros((B, K + 1, V), np.float32)
    # block_v 128, GPU splits of 2 tiles: ties across tiles of one split (5, 200) and
    # across splits (300, 599).
    p[:, :, [5, 200, 300, 599]] = 1 / 4
    p[1, 2] = 0.0
    p[1, 2, [450, 260, 130]] = 1 / 3           # bonus: 260/450 share a split, 130 wins
    d = np.full((B, K), 7, np.int32)           # p(d) = 0: always rejected
    q = np.zeros((B, K, V), np.float32)
    q[:, :, 7] = 1.0
    args = (jnp.asarray(p), jnp.asarray(q), jnp.asarray(d), jnp.zeros((B, K), jnp.float32),
            jnp.zeros((B, K + 1, V), jnp.float32))
    kw = dict(block_v=128) | ({"num_splits": 3} if platform == "gpu" else {})
    _assert_same_tokens(args, platform, **kw)
    n, t = rejection_pallas.rejection_sample(*args, interpret=True, platform=platform, **kw)
    assert np.asarray(t)[:, 0].tolist() == [5, 5]
    assert np.asarray(t)[1, 2] == 130


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_rejection_k0_bonus_only(platform):
    """K = 0 (plain decoding): the token is argmax(log p + g), as the XLA reference's."""
    args = rejection_inputs(5, 3, 0, 300)
    n, t = rejection_pallas.rejection_sample(*args, interpret=True, platform=platform,
                                             block_v=128)
    want = jnp.argmax(jnp.log(args[0]) + args[4], axis=-1)
    np.testing.assert_array_equal(np.asarray(n), 0)
    np.testing.assert_array_equal(np.asarray(t), np.asarray(want))
    n_ref, t_ref = rejection_sample_xla(*args)
    np.testing.assert_array_equal(np.asarray(n), np.asarray(n_ref))
    np.testing.assert_array_equal(np.asarray(t), np.asarray(t_ref))


def test_rejection_dispatch():
    args = rejection_inputs(11, 3, 2, 200, one_hot_q=True)
    n_ref, t_ref = kernels.rejection_sample(*args, backend="xla")
    n, t = jax.jit(functools.partial(kernels.rejection_sample, backend="interpret"))(*args)
    np.testing.assert_array_equal(np.asarray(t), np.asarray(t_ref))
    np.testing.assert_array_equal(np.asarray(n), np.asarray(n_ref))


# ----------------------------------------------------------------------------- lowering

# name: (Hq, Hkv, head_dim, vocab)
MODELS = {
    "llama-3.1-8b": (32, 8, 128, 128256),
    "qwen2.5-7b": (28, 4, 128, 152064),
    "qwen3-8b": (32, 8, 128, 151936),
}
LOWER_B, LOWER_T, LOWER_S = 8, 5, 2048
LOWER_N = 12   # cache rows (> B, not a power of two): the kernels take the whole buffer
LOWERING = {"cuda": "gpu", "tpu": "tpu"}


def _lower(fn, args, lowering_platform):
    """Lower for a platform this host does not have (`lowering.lower_for`). Skips (with the
    exact reason) only when this jax build has no Pallas lowering for it; any other failure
    is a real bug."""
    try:
        return lower_for(lowering_platform, jax.jit(fn), *args)
    except ValueError as e:  # raised by pallas_call when its Triton/Mosaic backend is missing
        if "Cannot lower pallas_call on platform" in str(e):
            pytest.skip(f"this jax build cannot lower Pallas for {lowering_platform}: {e}")
        raise


def _check_lowered(lowered, lowering_platform):
    text = lowered.as_text()
    if lowering_platform == "tpu":
        assert "tpu_custom_call" in text
        return
    modules = _triton_modules(lowered)
    assert modules, "no Triton kernel call in the CUDA lowering (Mosaic GPU chosen?)"
    for blob in modules:
        _triton_text(blob, verify=True)


def _triton_modules(lowered):
    from jax._src.lib.mlir import ir
    blobs = []

    def walk(op):
        if op.name == "stablehlo.custom_call":
            target = ir.StringAttr(op.attributes["call_target_name"]).value
            if "triton" in target:
                key = "mhlo.backend_config" if "mhlo.backend_config" in op.attributes \
                    else "backend_config"
                blobs.append(ir.StringAttr(ir.DictAttr(op.attributes[key])["ir"]).value_bytes)
        return ir.WalkResult.ADVANCE

    lowered.compiler_ir("stablehlo").operation.walk(walk)
    return blobs


def _triton_text(blob, verify: bool = False) -> str:
    """A Triton kernel's IR as text; `verify`: check it with the Triton dialect's verifier."""
    from jax._src.interpreters import mlir
    from jax._src.lib import triton
    from jax._src.lib.mlir import ir
    ctx = mlir.make_ir_context()
    triton.dialect.register_dialect(ctx)
    with ctx:
        module = ir.Module.parse(blob)
        assert not verify or module.operation.verify()
        return str(module)


@pytest.mark.parametrize("lowering_platform", list(LOWERING))
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("model", list(MODELS))
def test_verify_attention_lowers(model, dtype, lowering_platform):
    Hq, Hkv, D, _ = MODELS[model]
    B, T, S, N = LOWER_B, LOWER_T, LOWER_S, LOWER_N
    sds = jax.ShapeDtypeStruct
    args = (sds((B, T, Hq, D), dtype), sds((N, Hkv, S, D), dtype), sds((N, Hkv, S, D), dtype),
            sds((B, T), jnp.int32), sds((B,), jnp.int32))
    fn = functools.partial(attention_pallas.verify_attention,
                           platform=LOWERING[lowering_platform])
    _check_lowered(_lower(fn, args, lowering_platform), lowering_platform)


@pytest.mark.parametrize("lowering_platform", list(LOWERING))
@pytest.mark.parametrize("one_hot_q", [False, True], ids=["q", "onehotq"])
@pytest.mark.parametrize("model", list(MODELS))
def test_rejection_lowers(model, one_hot_q, lowering_platform):
    V = MODELS[model][3]
    B, K = LOWER_B, LOWER_T - 1
    sds = jax.ShapeDtypeStruct
    args = (sds((B, K + 1, V), F32), None if one_hot_q else sds((B, K, V), F32),
            sds((B, K), jnp.int32), sds((B, K), F32), sds((B, K + 1, V), F32))
    fn = functools.partial(rejection_pallas.rejection_sample, platform=LOWERING[lowering_platform])
    _check_lowered(_lower(fn, args, lowering_platform), lowering_platform)


@pytest.mark.parametrize("K, one_hot_q", [(4, False), (4, True), (0, True)])
def test_gpu_rejection_is_two_triton_calls(K, one_hot_q):
    """On a GPU the whole sampler is the pass and the finish kernel: no XLA op around them
    (the split merge and the epilogue as XLA ops were ~70 small ops, and at B = 1 the
    sampler took 65 us on an H200 against XLA's 30)."""
    B, V = 1, 128256
    sds = jax.ShapeDtypeStruct
    args = (sds((B, K + 1, V), F32), None if one_hot_q else sds((B, K, V), F32),
            sds((B, K), jnp.int32), sds((B, K), F32), sds((B, K + 1, V), F32))
    fn = functools.partial(rejection_pallas.rejection_sample, platform="gpu")
    lowered = _lower(fn, args, "cuda")
    ops = [line.split("=", 1)[-1].split()[0] for line in lowered.as_text().splitlines()
           if "stablehlo." in line]
    assert ops == ['stablehlo.custom_call'] * 2, ops
    pass_ir, finish_ir = (_triton_text(blob) for blob in _triton_modules(lowered))
    # the pass's logs an element: log p, and log r unless q is one-hot (r = p off the draft)
    assert pass_ir.count('symbol = "__nv_logf"') == (1 if one_hot_q or K == 0 else 2)
    assert "scf.for" in pass_ir and "scf.for" not in finish_ir


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_rejection_one_hot_draft_column_above_one(platform):
    """One-hot q and p(d) rounded above 1: the reference's residual at the draft column is
    p(d) - 1 > 0. The GPU pass leaves that column out (r = p elsewhere) and its finish
    kernel adds it back. Such a draft is always accepted, so its recovered token shows
    only as padding after an earlier rejection: position 0 rejects, position 1's draft
    column has the top residual score, and token 1 must be that draft."""
    B, K, V = 2, 2, 300
    d = np.array([[7, 150], [299, 0]], np.int32)
    p = np.full((B, K + 1, V), 1e-9, np.float32)
    g = np.full((B, K + 1, V), -5.0, np.float32)
    p[:, 0, 3] = 0.5                                  # p(d_0) = 1e-9: rejected
    rows = np.arange(B)
    p[rows, 1, d[:, 1]] = np.nextafter(np.float32(1), np.float32(2))
    g[rows, 1, d[:, 1]] = 60.0                        # log(1.2e-7) + 60 > log(1e-9) - 5
    args = (jnp.asarray(p), None, jnp.asarray(d), jnp.full((B, K), 0.5, F32), jnp.asarray(g))
    kw = dict(block_v=128) | ({"num_splits": 2} if platform == "gpu" else {})
    n_ref = _assert_same_tokens(args, platform, **kw)
    assert n_ref.tolist() == [0, 0]
    assert np.asarray(rejection_sample_xla(*args)[1])[:, 1].tolist() == d[:, 1].tolist()


@pytest.mark.parametrize("lowering_platform", list(LOWERING))
def test_odd_shapes_lower(lowering_platform):
    """Edge shapes: T = 9 with GQA 7 (63 rows), T = 1, head_dim 64, cache lengths that are
    not a block multiple (max_seq_len + max_k + 1; S < 128; 128 < S < 512 as one block),
    prefill chunks of 64 and 256 tokens (several Triton row tiles, TPU positions from VMEM),
    rows=None with N > B, a cache buffer over 4 GiB (64-bit Triton offsets), K = 0 and
    K = 8 rejection, a small vocab that is one non-128-multiple block."""
    sds = jax.ShapeDtypeStruct
    platform = LOWERING[lowering_platform]
    for (B, T, Hq, Hkv, S, D, N, rows) in [(3, 9, 28, 4, 2057, 128, 5, True),
                                           (1, 1, 8, 8, 100, 64, 1, True),
                                           (2, 3, 16, 2, 300, 64, 7, False),
                                           (4, 5, 32, 8, 32777, 128, 64, True),
                                           (2, 64, 28, 4, 2057, 128, 3, True),     # prefill chunks:
                                           (1, 256, 32, 8, 8201, 128, 2, True)]:  # row tiles
        args = (sds((B, T, Hq, D), BF16), sds((N, Hkv, S, D), BF16), sds((N, Hkv, S, D), BF16),
                sds((B, T), jnp.int32), sds((B,), jnp.int32) if rows else None)
        fn = functools.partial(attention_pallas.verify_attention, platform=platform)
        _check_lowered(_lower(fn, args, lowering_platform), lowering_platform)
    for K, V in ((0, 151936), (8, 151936), (3, 1000)):
        B = 3
        args = (sds((B, K + 1, V), F32), sds((B, K, V), F32), sds((B, K), jnp.int32),
                sds((B, K), F32), sds((B, K + 1, V), F32))
        fn = functools.partial(rejection_pallas.rejection_sample, platform=platform)
        _check_lowered(_lower(fn, args, lowering_platform), lowering_platform)
