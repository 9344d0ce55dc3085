"""Draft proposals, computed inside the step program (no host round trips).

- `draft_model`: a smaller model of `dsd_jax.models` sharing the vocabulary. Its cache
  may lag behind the committed tokens (after K = 0 rounds it is not run at all), so a
  proposal first catches up by chunked prefill, re-reads a two-token window ending at
  the pending token, then proposes d_1..d_K one token at a time in a `scan`.
- `ngram` (prompt lookup): the most recent earlier occurrence of the slot's last n
  tokens (n from max to min) proposes the tokens that followed it; one-hot q.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dsd_jax import sampling
from dsd_jax.models import forward

WINDOW = 2  # tokens the draft re-reads each round: after an all-accepted round it lags by 2


def gather_tokens(tokens, positions):
    """tokens [B, S], positions [B, T] (may be out of range) -> [B, T]."""
    return jnp.take_along_axis(tokens, jnp.clip(positions, 0, tokens.shape[1] - 1), axis=1)


def catch_up(draft_graph, draft_params, kv, tokens, length, draft_len, active, chunk: int,
             attn_backend: str):
    """Chunked prefill of the draft cache up to `length - WINDOW`, for every row whatever
    its lag; zero iterations in the common case."""
    def remaining(dl):
        return jnp.where(active, length - WINDOW - dl, 0)

    def body(carry):
        dl, kv = carry
        n = jnp.clip(remaining(dl), 0, chunk)
        pos = dl[:, None] + jnp.arange(chunk)
        toks = gather_tokens(tokens, pos)
        pos = jnp.where(jnp.arange(chunk) < n[:, None], pos, -1)
        _, kv = forward(draft_graph, draft_params, toks, pos, kv, attn_backend=attn_backend)
        return dl + n, kv

    return lax.while_loop(lambda c: jnp.max(remaining(c[0])) > 0, body, (draft_len, kv))


def propose_with_draft_model(draft_graph, draft_params, kv, tokens, length, draft_len, active,
                             sp, K: int, mode: str, catchup_chunk: int, attn_backend: str):
    """Returns (drafts [B, K], q [B, K, V] or None for one-hot q, kv, draft cache length).

    mode: "sample" (d ~ q, q kept), "argmax" (one-hot q) or "coupled" (drafter-invariant:
    d = argmax(log q + g) with the target's noise g at that position).
    sp: (temperature, top_k, top_p, seed) per row.
    """
    temperature, top_k, top_p, seed = sp
    draft_len, kv = catch_up(draft_graph, draft_params, kv, tokens, length, draft_len, active,
                             catchup_chunk, attn_backend)
    pos = length[:, None] - WINDOW + jnp.arange(WINDOW)
    toks = gather_tokens(tokens, pos)
    pos = jnp.where((pos >= 0) & active[:, None], pos, -1)
    logits, kv = forward(draft_graph, draft_params, toks, pos, kv, attn_backend=attn_backend)

    def propose(logits, position):
        """logits [B, V] of the draft at `position` [B] -> (token [B], q [B, V])."""
        proc = sampling.processed_logits(logits, temperature, top_k, top_p)
        if mode == "argmax":
            return jnp.argmax(proc, axis=-1).astype(jnp.int32), None
        stream = sampling.STREAM_TARGET if mode == "coupled" else sampling.STREAM_DRAFT
        noise = sampling.noise_if_sampling(temperature, lambda: sampling.gumbel_noise(
            seed, position[:, None], stream, logits.shape[-1])[:, 0])
        token = sampling.gumbel_argmax(proc, noise, temperature)
        if mode == "coupled":
            return token, None
        return token, sampling.probs_from_processed(proc, temperature)

    first, q_first = propose(logits[:, -1], length)

    def step(carry, i):
        kv, prev = carry
        p = jnp.where(active, length - 1 + i, -1)[:, None]
        logits, kv = forward(draft_graph, draft_params, prev[:, None], p, kv,
                             attn_backend=attn_backend)
        token, q = propose(logits[:, 0], length + i)
        return (kv, token), (token, q)

    (kv, _), (rest, q_rest) = lax.scan(step, (kv, first), jnp.arange(1, K))
    drafts = jnp.concatenate([first[:, None], jnp.moveaxis(rest, 0, 1)], axis=1)
    q = None if q_first is None else jnp.concatenate([q_first[:, None], jnp.moveaxis(q_rest, 0, 1)], 1)
    # The draft cache now holds everything up to the pending token (position length-1).
    return drafts, q, kv, jnp.where(active, jnp.maximum(draft_len, length), draft_len)


def propose_ngram(tokens, length, K: int, min_n: int, max_n: int):
    """Prompt lookup over each row's own committed tokens -> drafts [B, K].

    Longest n first; the most recent match wins. Rows without a match propose their last
    token repeated (it is verified like any draft, so output stays lossless).
    """
    S = tokens.shape[1]
    starts = jnp.arange(S)
    drafts = jnp.repeat(gather_tokens(tokens, length[:, None] - 1), K, axis=1)
    found = jnp.zeros(length.shape, bool)
    for n in range(max_n, min_n - 1, -1):
        suffix = gather_tokens(tokens, length[:, None] - n + jnp.arange(n))  # [B, n]
        match = jnp.ones(tokens.shape, bool)
        for i in range(n):
            match &= jnp.roll(tokens, -i, axis=1) == suffix[:, i:i + 1]
        # the match must end before the suffix starts, and the suffix must exist
        match &= (starts[None, :] + n < length[:, None]) & (length[:, None] >= n)
        best = jnp.max(jnp.where(match, starts[None, :], -1), axis=1)
        hit = (best >= 0) & ~found
        cont = gather_tokens(tokens, (best + n)[:, None] + jnp.arange(K))
        # continuation tokens past the committed ones are unknown: repeat the last known
        cont_pos = (best + n)[:, None] + jnp.arange(K)
        cont = jnp.where(cont_pos < length[:, None], cont, drafts)
        drafts = jnp.where(hit[:, None], cont, drafts)
        found |= hit
    return drafts
