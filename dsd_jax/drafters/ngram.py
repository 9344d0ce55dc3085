"""Method "ngram" (prompt lookup): the most recent earlier occurrence of the slot's last
n tokens (n from max to min) proposes the tokens that followed it; one-hot q, no state."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from dsd_jax.drafters.base import Drafter, Proposal, gather_tokens


def lookup(tokens, length, K: int, min_n: int, max_n: int):
    """Prompt lookup over each row's own committed tokens -> drafts [B, K].

    Longest n first; the most recent match wins. Rows without a match propose their last
    token repeated (it is verified like any draft, so output stays lossless).
    """
    S = tokens.shape[1]
    starts = jnp.arange(S)
    drafts = jnp.repeat(gather_tokens(tokens, length[:, None] - 1), K, axis=1)
    found = jnp.zeros(length.shape, bool)
    # a match must end before the row's last n tokens start, so n <= S - 1: each larger n
    # would only unroll another compare over the buffer that can never hit
    for n in range(min(max_n, S - 1), min_n - 1, -1):
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


@dataclasses.dataclass(frozen=True, eq=False)
class NGram(Drafter):
    shares_programs = True
    min_n: int = 1
    max_n: int = 3

    @classmethod
    def build(cls, spec, model=None, backend="auto"):
        return cls(spec.prompt_lookup_min, spec.prompt_lookup_max)

    def propose(self, params, state, ctx, K):
        return Proposal(lookup(ctx.tokens, ctx.length, K, self.min_n, self.max_n), None, state)
