"""vLLM's repetition, presence and frequency penalties, from each row's token history.

As vLLM (and the OpenAI API) define them, on the raw logits before temperature and the
filters: repetition_penalty r (1: off) divides a positive logit by r and multiplies a
negative one by r, for every token seen in the prompt or the completion so far;
frequency_penalty f subtracts f times the token's count in the completion, and
presence_penalty p subtracts p once for any token in it. A greedy row takes the argmax
of the penalised logits.

A speculative round decides K+1 positions in one target forward, and position j's
history is the committed tokens plus drafts d_1..d_j: each position gets its own
counts. They are recounted from the device's token buffer every round, so there is no
per-slot count state to keep in step with acceptance, slot moves and admission; and
the whole thing is skipped when no live row penalises. A drafter's logits get the same
penalties for the position it proposes (`penalised_draft_logits`), so its drafts are the
ones the penalised target would pick.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Penalties(NamedTuple):
    """Per-row penalty settings, [B] float32 each (neutral: 1, 0, 0)."""

    repetition: jax.Array
    presence: jax.Array
    frequency: jax.Array

    def any_on(self, active) -> jax.Array:
        """Whether a live row penalises anything (a scalar)."""
        on = (self.repetition != 1.0) | (self.presence != 0.0) | (self.frequency != 0.0)
        return jnp.any(active & on)


def _history(tokens, prompt_length, length, vocab: int):
    """Each row's committed history: (seen in the prompt [B, V] bool, counts in the
    completion [B, V] int32). tokens [B, C]: committed up to length [B], the prompt up to
    prompt_length [B]."""
    B, C = tokens.shape
    at = jnp.arange(C)[None, :]
    rows = jnp.arange(B)[:, None]
    in_completion = (at >= prompt_length[:, None]) & (at < length[:, None])
    in_prompt = at < prompt_length[:, None]
    counts = jnp.zeros((B, vocab), jnp.int32).at[rows, tokens].add(in_completion.astype(jnp.int32),
                                                                    mode="drop")
    prompt_seen = jnp.zeros((B, vocab), jnp.int32).at[rows, tokens].add(in_prompt.astype(jnp.int32),
                                                                        mode="drop") > 0
    return prompt_seen, counts


def occurrences(tokens, prompt_length, length, drafts, vocab: int):
    """What each window position's history holds: (seen [B, T, V] bool, in the prompt or
    the completion; counts [B, T, V] int32, in the completion only).

    tokens [B, C]: committed up to length [B], the prompt up to prompt_length [B];
    drafts [B, T-1]: the proposals at positions length.., so position j's history adds
    drafts[:, :j] to the committed tokens."""
    B = tokens.shape[0]
    prompt_seen, counts = _history(tokens, prompt_length, length, vocab)
    drafted = jnp.cumsum(jax.nn.one_hot(drafts, vocab, dtype=jnp.int32), axis=1)  # [B, T-1, V]
    counts = counts[:, None, :] + jnp.concatenate([jnp.zeros((B, 1, vocab), jnp.int32), drafted], 1)
    return prompt_seen[:, None, :] | (counts > 0), counts


def penalise(logits, seen, counts, penalties: Penalties):
    """vLLM's `apply_penalties` on float32 logits [B, T, V] (its arithmetic: a scale by
    1/r or r, then the frequency and presence terms)."""
    expand = lambda x: x[:, None, None]
    r = jnp.where(seen, expand(penalties.repetition), 1.0)
    logits = logits * jnp.where(logits > 0, 1.0 / r, r)
    logits = logits - expand(penalties.frequency) * counts
    return logits - expand(penalties.presence) * (counts > 0)


def penalised_logits(logits, penalties: Penalties, active, tokens, prompt_length, length, drafts):
    """The window's logits [B, T, V] (float32) with each row's penalties applied, or the
    logits unchanged when no live row penalises (the counting is skipped)."""
    logits = logits.astype(jnp.float32)

    def apply(x):
        seen, counts = occurrences(tokens, prompt_length, length, drafts, x.shape[-1])
        return penalise(x, seen, counts, penalties)

    return jax.lax.cond(penalties.any_on(active), apply, lambda x: x, logits)


def penalised_draft_logits(logits, penalties: Penalties, active, tokens, prompt_length, length, drafted):
    """A drafter's logits [B, V] (float32) for the token after the committed ones and its
    own proposals so far, `drafted` [B, J] (-1: none), penalised as the target will
    penalise that position (a draft the penalty pushes away would only be rejected); the
    logits unchanged when no live row penalises."""
    logits = logits.astype(jnp.float32)

    def apply(x):
        B, V = x.shape
        prompt_seen, counts = _history(tokens, prompt_length, length, V)
        ids = jnp.where(drafted >= 0, drafted, V)  # V: out of range, dropped
        counts = counts.at[jnp.arange(B)[:, None], ids].add(1, mode="drop")
        seen = prompt_seen | (counts > 0)
        return penalise(x[:, None], seen[:, None], counts[:, None], penalties)[:, 0]

    return jax.lax.cond(penalties.any_on(active), apply, lambda x: x, logits)
