"""Kernels behind one dispatch: pure-XLA references on CPU, Pallas on GPU/TPU.

`backend` is "auto" (Pallas on GPU/TPU, XLA elsewhere), "xla", "pallas" or
"interpret" (the Pallas code run by the interpreter, for CPU tests). `platform`
("gpu" | "tpu" | None) picks the Pallas variant; None means the default backend,
or the TPU variant when interpreting on a CPU host. Models and step programs call
kernels only through these functions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .attention_ref import verify_attention_xla
from .cache_attention import attend_and_write_xla, write_entries
from .rejection_ref import coupled_accept_xla, first_rejection, rejection_sample_xla

BACKENDS = ("auto", "xla", "pallas", "interpret")


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "pallas" if jax.default_backend() in ("gpu", "tpu") else "xla"
    return backend


def verify_attention(q, k_cache, v_cache, q_positions, rows=None, *, backend: str = "auto",
                     platform: str | None = None):
    """See `attention_ref.verify_attention_xla` for shapes and semantics."""
    backend = resolve_backend(backend)
    if backend == "xla":
        return verify_attention_xla(q, k_cache, v_cache, q_positions, rows)
    from . import attention_pallas
    return attention_pallas.verify_attention(q, k_cache, v_cache, q_positions, rows,
                                             interpret=backend == "interpret", platform=platform)


def attend_and_write(q, k_new, v_new, positions, k_cache, v_cache, rows=None, *,
                     backend: str = "auto", platform: str | None = None):
    """Writes the new entries into the cache and attends over each row's live context.

    q [B, T, Hq, D]; k_new, v_new [B, T, Hkv, D]; positions [B, T] int32 (< 0: padding,
    not written, its output is garbage the caller ignores); caches [N, Hkv, S, D], batch
    row b using cache row rows[b] (b when rows is None). Query (b, t) attends entries
    0..positions[b, t] of its row, the new ones included. Returns (out [B, T, Hq, D],
    k_cache, v_cache); the caches are updated in place (see `cache_attention`).
    """
    backend = resolve_backend(backend)
    if backend == "xla":
        return attend_and_write_xla(q, k_new, v_new, positions, k_cache, v_cache, rows)
    idx = jnp.arange(q.shape[0], dtype=jnp.int32) if rows is None else rows
    k_cache = write_entries(k_cache, k_new, idx, positions)
    v_cache = write_entries(v_cache, v_new, idx, positions)
    out = verify_attention(q, k_cache, v_cache, jnp.maximum(positions, 0), rows, backend=backend,
                           platform=platform)
    return out, k_cache, v_cache


def rejection_sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise, *,
                     backend: str = "auto", platform: str | None = None):
    """See `rejection_ref.rejection_sample_xla` for shapes and semantics."""
    backend = resolve_backend(backend)
    if backend == "xla":
        return rejection_sample_xla(target_probs, draft_probs, draft_tokens, uniforms, residual_noise)
    from . import rejection_pallas
    return rejection_pallas.rejection_sample(target_probs, draft_probs, draft_tokens, uniforms,
                                             residual_noise, interpret=backend == "interpret",
                                             platform=platform)


__all__ = ["BACKENDS", "resolve_backend", "verify_attention", "verify_attention_xla",
           "attend_and_write", "attend_and_write_xla", "write_entries",
           "rejection_sample", "rejection_sample_xla", "coupled_accept_xla", "first_rejection"]
