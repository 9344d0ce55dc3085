"""Pure-XLA reference for lossless rejection sampling (Leviathan et al. 2023)."""

from __future__ import annotations

import jax.numpy as jnp


def first_rejection(accepted):
    """Number of leading True entries per row: accepted [B, K] bool -> [B] int32."""
    return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def rejection_sample_xla(target_probs, draft_probs, draft_tokens, uniforms, residual_noise):
    """Accepts a prefix of the drafts and emits one recovered or bonus token per row.

    target_probs:   [B, K+1, V] float32  p_1..p_{K+1} (sampling distributions; one-hot for greedy rows)
    draft_probs:    [B, K, V]   float32  q_1..q_K, or None for one-hot q at draft_tokens
    draft_tokens:   [B, K]      int32    d_1..d_K
    uniforms:       [B, K]      float32  in [0, 1): accept d_i iff u_i * q_i(d_i) < p_i(d_i)
    residual_noise: [B, K+1, V] float32  Gumbel noise: the token emitted at position i is
                    argmax(log r_i + noise_i), with r_i = max(p_i - q_i, 0) for i <= K
                    (the recovered token) and r_{K+1} = p_{K+1} (the bonus token)

    Returns (num_accepted [B] int32, tokens [B, K+1] int32): tokens[:, :n] are the
    accepted drafts, tokens[:, n] the recovered/bonus token, the rest is padding
    (the draft tokens / unused residual samples).
    """
    K = draft_tokens.shape[1]
    V = target_probs.shape[-1]
    p_at_d = jnp.take_along_axis(target_probs[:, :K], draft_tokens[..., None], axis=-1)[..., 0]
    if draft_probs is None:
        q_at_d = jnp.ones_like(p_at_d)
        q = jnp.arange(V) == draft_tokens[..., None]
    else:
        q_at_d = jnp.take_along_axis(draft_probs, draft_tokens[..., None], axis=-1)[..., 0]
        q = draft_probs
    num_accepted = first_rejection(uniforms * q_at_d < p_at_d)

    residual = jnp.maximum(target_probs[:, :K] - q, 0.0)
    # p == q leaves no residual mass; a rejection is then impossible, so any row works.
    residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, target_probs[:, :K])
    residual = jnp.concatenate([residual, target_probs[:, K:]], axis=1)
    scores = jnp.log(residual) + residual_noise  # log 0 = -inf: never chosen
    sampled = jnp.argmax(scores, axis=-1).astype(jnp.int32)  # [B, K+1]

    padded_drafts = jnp.concatenate([draft_tokens, jnp.zeros_like(sampled[:, :1])], axis=1)
    pos = jnp.arange(K + 1)[None, :]
    tokens = jnp.where(pos < num_accepted[:, None], padded_drafts, sampled)
    return num_accepted, tokens


def coupled_accept_xla(target_tokens, draft_tokens):
    """Drafter-invariant acceptance (Gumbel-max coupling): accept d_i iff it equals the
    target's own Gumbel-argmax token t_i at that position; every emitted token is t_i.

    target_tokens [B, K+1], draft_tokens [B, K] -> (num_accepted [B], tokens [B, K+1]).
    """
    num_accepted = first_rejection(target_tokens[:, :-1] == draft_tokens)
    return num_accepted, target_tokens

