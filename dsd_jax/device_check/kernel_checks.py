"""The ``kernels`` section: the Pallas kernels against their XLA references on this device."""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from dsd_jax.kernels import attention_pallas, rejection_pallas
from dsd_jax.kernels.attention_ref import verify_attention_xla
from dsd_jax.kernels.rejection_ref import rejection_sample_xla

from .settings import TOL, Settings, _unless_expired


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
