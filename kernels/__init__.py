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
from jax.sharding import PartitionSpec as P

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


def _model_axis() -> int:
    """Size of the "model" axis of the mesh being traced under (`jax.set_mesh`); 1 without."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else dict(mesh.shape).get("model", 1)


def _per_device(fn, in_specs, out_specs):
    """`fn` once per device of the context mesh: GSPMD cannot partition a Pallas call (a
    custom call), so the kernels run under `shard_map` on their local shards, with no
    collectives inside."""
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs, check_vma=False)


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

    def scatter_then_attend(q, k_new, v_new, positions, k_cache, v_cache, idx):
        k_cache = write_entries(k_cache, k_new, idx, positions)
        v_cache = write_entries(v_cache, v_new, idx, positions)
        out = verify_attention(q, k_cache, v_cache, jnp.maximum(positions, 0),
                               None if rows is None else idx, backend=backend, platform=platform)
        return out, k_cache, v_cache

    m = _model_axis()
    if m == 1:
        return scatter_then_attend(q, k_new, v_new, positions, k_cache, v_cache, idx)
    # Heads local when the KV heads split over "model" (as `dsd_jax.sharding` lays out the
    # cache); otherwise the cache is replicated and every device attends over all heads.
    heads = "model" if k_cache.shape[1] % m == 0 else None
    per_head, per_cache, rep = P(None, None, heads, None), P(None, heads, None, None), P()
    return _per_device(scatter_then_attend,
                       (per_head, per_head, per_head, rep, per_cache, per_cache, rep),
                       (per_head, per_cache, per_cache))(q, k_new, v_new, positions, k_cache,
                                                         v_cache, idx)


def rejection_sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise, *,
                     backend: str = "auto", platform: str | None = None):
    """See `rejection_ref.rejection_sample_xla` for shapes and semantics."""
    backend = resolve_backend(backend)
    if backend == "xla":
        return rejection_sample_xla(target_probs, draft_probs, draft_tokens, uniforms, residual_noise)
    from . import rejection_pallas

    def sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise):
        return rejection_pallas.rejection_sample(target_probs, draft_probs, draft_tokens, uniforms,
                                                 residual_noise, interpret=backend == "interpret",
                                                 platform=platform)

    if _model_axis() == 1:
        return sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise)
    # replicated: every device samples the same tokens from the same (gathered) inputs
    return _per_device(sample, P(), P())(target_probs, draft_probs, draft_tokens, uniforms,
                                         residual_noise)


__all__ = ["BACKENDS", "resolve_backend", "verify_attention", "verify_attention_xla",
           "attend_and_write", "attend_and_write_xla", "write_entries",
           "rejection_sample", "rejection_sample_xla", "coupled_accept_xla", "first_rejection"]
