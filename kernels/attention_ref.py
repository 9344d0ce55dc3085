"""Pure-XLA reference for verify attention: T new queries per sequence against its KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def verify_attention_xla(q, k_cache, v_cache, q_positions, rows=None):
    """Causal GQA attention of new queries against a per-slot KV cache.

    q:            [B, T, Hq, D]   queries of the T new tokens (already rotated)
    k_cache:      [N, Hkv, S, D]  the whole cache buffer (N >= B), the new tokens'
                                  entries already written
    v_cache:      [N, Hkv, S, D]
    q_positions:  [B, T] int32    absolute position of each query
    rows:         None or [B] int32 in [0, N): the cache row of batch row b (any
                                  order, repeats allowed); None means rows 0..B-1

    Query (b, t) attends to entries 0..q_positions[b, t] of cache row rows[b]; the mask
    comes from positions only, so padding tokens and stale entries past a sequence's
    length are never read. Returns [B, T, Hq, D] in q's dtype; softmax runs in float32.
    (This oracle gathers the rows; the Pallas kernels address them in place.)
    """
    B, T, Hq, D = q.shape
    if rows is None:
        k_cache, v_cache = k_cache[:B], v_cache[:B]
    else:
        k_cache, v_cache = k_cache[rows], v_cache[rows]
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    qg = q.reshape(B, T, Hkv, group, D)
    scores = jnp.einsum("bthgd,bhsd->bhgts", qg, k_cache,
                        preferred_element_type=jnp.float32) * (D ** -0.5)
    visible = jnp.arange(S)[None, None, :] <= q_positions[:, :, None]  # [B, T, S]
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    # Output in "bhgtd" order, then transpose: written directly as "bthgd", XLA:CPU emits a
    # dot that its runtime rejects for bf16 x bf16 -> f32 ("Unsupported element type for
    # DotThunk").
    out = jnp.einsum("bhgts,bhsd->bhgtd", weights.astype(v_cache.dtype), v_cache,
                     preferred_element_type=jnp.float32)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, Hq, D).astype(q.dtype)
