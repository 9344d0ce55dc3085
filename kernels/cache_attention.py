"""Write the new KV entries into the cache and attend over the live context, in place.

`attend_and_write` is the only place a model touches its KV cache. Its cost follows
what a step reads and writes (the T new entries of B rows, and the live context), not
the cache's capacity:

* The cache is the whole `[N, Hkv, S, D]` buffer; batch row b uses cache row
  `rows[b]` (b when rows is None). Nothing slices or gathers whole cache rows.
* XLA path: a `fori_loop` over KV blocks up to the longest live position, with online
  softmax (flash-attention style). The loop *carries* the cache and scatters the new
  entries into it inside the body (the same T entries every iteration, a no-op after
  the first). Both halves matter, measured on XLA:CPU: attending to a buffer and also
  updating it outside a loop made copy insertion materialise whole-capacity copies of
  every layer's cache each step (the update, fused into the attention's operand,
  became a copy), and a loop that only *reads* a cache that is updated afterwards
  needs a copy too (the loop's operand must outlive it). Carried and written inside,
  the update is in place and each iteration reads one block.
* Pallas path (GPU/TPU): the scatter runs first (in place: nothing else reads the
  old buffer), then the kernel reads only the live blocks of the selected rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

DEFAULT_BLOCK = 256  # KV positions per loop iteration on the XLA path (see docs/design.md)


def write_entries(cache, new, rows, positions):
    """Scatters new [B, T, Hkv, D] into cache [N, Hkv, S, D] at (rows[b], :, positions[b, t]).

    A position < 0 or >= S is dropped (never clamped onto a valid entry)."""
    S = cache.shape[2]
    write_pos = jnp.where(positions < 0, S, positions)
    return cache.at[rows[:, None], :, write_pos].set(new.astype(cache.dtype), mode="drop")


def _block_size(S: int, block: int) -> int:
    # A block as long as the buffer would make the per-block read the whole buffer, which
    # XLA turns back into a copy of it: keep blocks strictly shorter than S.
    return max(1, min(block, S - 1))


def attend_and_write_xla(q, k_new, v_new, positions, k_cache, v_cache, rows=None, *,
                         block: int = DEFAULT_BLOCK):
    """See `attend_and_write`; the blocked pure-XLA version."""
    B, T, Hq, D = q.shape
    N, Hkv, S, _ = k_cache.shape
    group = Hq // Hkv
    blk = _block_size(S, block)
    idx = jnp.arange(B, dtype=jnp.int32) if rows is None else rows.astype(jnp.int32)
    q_pos = jnp.maximum(positions, 0)
    qg = q.reshape(B, T, Hkv, group, D)
    num_blocks = jnp.max(q_pos) // blk + 1  # >= 1: the writes happen in the first iteration

    def block_of(cache, start):
        if rows is None:  # the first B rows: a static slice of the row dimension
            return lax.dynamic_slice(cache, (0, 0, start, 0), (B, Hkv, blk, D))
        return jax.vmap(lambda r: lax.dynamic_slice(cache, (r, 0, start, 0), (1, Hkv, blk, D))[0])(idx)

    def body(i, carry):
        m, l, acc, k_cache, v_cache = carry
        k_cache = write_entries(k_cache, k_new, idx, positions)
        v_cache = write_entries(v_cache, v_new, idx, positions)
        start = jnp.minimum(i * blk, S - blk)  # the last block may overlap the one before
        k, v = block_of(k_cache, start), block_of(v_cache, start)
        s = jnp.einsum("bthgd,bhsd->bhgts", qg, k, preferred_element_type=jnp.float32) * (D ** -0.5)
        kpos = start + jnp.arange(blk)
        visible = (kpos[None, None, :] <= q_pos[:, :, None]) & (kpos >= i * blk)[None, None, :]
        s = jnp.where(visible[:, None, None], s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # nothing visible yet: p = 0, no NaN
        alpha = jnp.exp(m - m_safe)
        p = jnp.exp(s - m_safe[..., None])
        pv = jnp.einsum("bhgts,bhsd->bhgtd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv, k_cache, v_cache

    init = (jnp.full((B, Hkv, group, T), -jnp.inf, jnp.float32), jnp.zeros((B, Hkv, group, T), jnp.float32),
            jnp.zeros((B, Hkv, group, T, D), jnp.float32), k_cache, v_cache)
    _, l, acc, k_cache, v_cache = lax.fori_loop(0, num_blocks, body, init)
    out = (acc / l[..., None]).transpose(0, 3, 1, 2, 4).reshape(B, T, Hq, D)
    return out.astype(q.dtype), k_cache, v_cache
