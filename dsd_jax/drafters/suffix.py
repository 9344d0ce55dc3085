"""Method "suffix" (vLLM's name for suffix decoding): the longest match of the slot's last
tokens in a token bank, which holds

- the slot's own committed tokens (what "ngram" searches),
- the committed tokens of the other live slots of its group (the other completions of
  the same prompt, `SamplingParams(n=G)`), read straight from the decode state, and
- the group's references, uploaded at admission (earlier rollouts of the prompt, from
  `generate(references=...)` or a `RolloutMemory`) into a bounded per-slot bank of
  `SpecConfig.suffix_bank_len` tokens, the newest kept when they do not fit. Each is
  stored behind the prompt's last `prompt_lookup_max` tokens, so the first tokens of a
  completion can be drafted from a reference as well.

The continuation after the match is proposed, up to K tokens, with one-hot q: it is
verified like any draft, so output stays lossless. Rows without a match propose their
last token repeated.

Choosing among matches: the longest suffix first (SuffixDecoding's rule: a longer shared
context predicts the continuation better); at equal length the slot's own tokens, then a
sibling's, then the references; within one source the most recent match. Recency rather
than frequency because the freshest text is the likeliest to repeat: a sample repeats
its own recent phrases, siblings are samples of the current policy, references of an
older one (and the newest reference sits last in the bank). Frequency counts would cost
a vocabulary-wide histogram per row and step.

Siblings are searched within the same data shard (the rows one program sees); on a
"data" mesh a group's completions on another shard are not consulted.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsd_jax.drafters.base import Drafter, Proposal, gather_tokens


class SuffixState(NamedTuple):
    group: jax.Array  # [N] int32 group id of the slot's request, -1: none
    bank: jax.Array  # [N, bank_len] int32 references, each followed by -1; -1 padding


def pack_references(references, bank_len: int) -> np.ndarray:
    """References (oldest first) -> one bank row: each followed by a -1 separator, -1
    padding after. When they do not all fit, the row keeps the last `bank_len` tokens of
    that sequence: the oldest references are dropped and the oldest one kept may lose its
    head; a newest reference longer than the row keeps only its tail."""
    row = np.full(bank_len, -1, np.int32)
    seq: list[int] = []
    for ref in references:
        seq += list(ref) + [-1]
    seq = seq[-bank_len:]
    row[:len(seq)] = seq
    return row


def _latest_match(source, suffix, n: int, valid):
    """Latest start p in `source` [..., L] where source[p:p+n] == suffix [..., n] and
    valid[..., p] -> [...] (-1: none). `valid` must exclude p + n >= L (roll wraps)."""
    match = valid
    for i in range(n):
        match &= jnp.roll(source, -i, axis=-1) == suffix[..., i:i + 1]
    return jnp.max(jnp.where(match, jnp.arange(source.shape[-1]), -1), axis=-1)


def lookup(tokens, length, active, group, bank, K: int, min_n: int, max_n: int):
    """Drafts [B, K] for rows 0..B-1: tokens [B, S], length [B], active [B], group [B],
    bank [B, Lb] (see the module docstring for the rule)."""
    B, S = tokens.shape
    Lb = bank.shape[1]
    rows = jnp.arange(B)
    base = jnp.repeat(gather_tokens(tokens, length[:, None] - 1), K, axis=1)
    drafts, found = base, jnp.zeros((B,), bool)
    # row r may serve row b: b itself, or a live row of b's group
    peers = (group[:, None] == group[None, :]) & (group[:, None] >= 0) & active[None, :]
    peers |= jnp.eye(B, dtype=bool)
    own_row = jnp.eye(B, dtype=bool)
    steps = jnp.arange(K)
    # larger n can never match (the row's suffix needs n <= S tokens, a match in a token row
    # n <= S - 1, one in the bank n <= Lb - 1): skip them rather than unroll their compares
    for n in range(min(max_n, S, max(S, Lb) - 1), min_n - 1, -1):
        suffix = gather_tokens(tokens, length[:, None] - n + jnp.arange(n))  # [B, n]
        has_suffix = length >= n
        # token rows: continuation start p + n must be committed in the source row
        in_row = jnp.arange(S)[None, None, :] + n < length[None, :, None]  # [1, r, S]
        latest = _latest_match(tokens[None], suffix[:, None, :], n,
                               in_row & peers[:, :, None] & has_suffix[:, None, None])  # [b, r]
        own = jnp.max(jnp.where(own_row, latest, -1), axis=1)
        sibling = jnp.where(own_row, -1, latest)
        sib_row, sib_p = jnp.argmax(sibling, axis=1), jnp.max(sibling, axis=1)
        # the bank: the continuation's first token must be a token, not a separator
        nxt = jnp.roll(bank, -n, axis=1)
        in_bank = (jnp.arange(Lb)[None, :] + n < Lb) & (nxt >= 0) & has_suffix[:, None]
        bank_p = _latest_match(bank, suffix, n, in_bank)

        use_own = own >= 0
        use_sib = ~use_own & (sib_p >= 0)
        use_bank = ~use_own & ~use_sib & (bank_p >= 0)
        src = jnp.where(use_own, rows, sib_row)
        at = jnp.where(use_own, own, sib_p)[:, None] + n + steps  # [B, K]
        cont = tokens[src[:, None], jnp.clip(at, 0, S - 1)]
        cont = jnp.where(at < length[src][:, None], cont, base)
        at_bank = bank_p[:, None] + n + steps
        from_bank = jnp.take_along_axis(bank, jnp.clip(at_bank, 0, Lb - 1), axis=1)
        # a reference ends at its separator: nothing after it is this continuation
        known = jnp.cumprod((at_bank < Lb) & (from_bank >= 0), axis=1).astype(bool)
        from_bank = jnp.where(known, from_bank, base)
        hit = (use_own | use_sib | use_bank) & ~found
        drafts = jnp.where(hit[:, None], jnp.where(use_bank[:, None], from_bank, cont), drafts)
        found |= hit
    return drafts


@dataclasses.dataclass(frozen=True, eq=False)
class Suffix(Drafter):
    reads_references: ClassVar[bool] = True
    shares_programs = True
    min_n: int = 1
    max_n: int = 3
    bank_len: int = 1024

    @classmethod
    def build(cls, spec, model=None, backend="auto"):
        return cls(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.suffix_bank_len)

    def init_state(self, num_slots: int, capacity: int) -> SuffixState:
        return SuffixState(jnp.full((num_slots,), -1, jnp.int32),
                           jnp.full((num_slots, self.bank_len), -1, jnp.int32))

    def admission_fields(self) -> dict:
        return {"group": ((), np.int32, -1), "bank": ((self.bank_len,), np.int32, -1)}

    def admission_value(self, name, request):
        if name == "group":
            return np.int32(request.group % (2 ** 31))
        # each reference behind the prompt's last max_n tokens: a slot that has generated
        # nothing yet ends in them, so its first tokens can be drafted from a reference too
        tail = list(request.prompt[-self.max_n:])
        return pack_references([tail + list(r) for r in request.references], self.bank_len)

    def admit(self, state, rows, lengths, extra=None):
        if extra is None:  # a reset (the profiler's): the slots keep their bank
            return state
        return SuffixState(state.group.at[rows].set(extra["group"], mode="drop"),
                           state.bank.at[rows].set(extra["bank"], mode="drop"))

    def propose(self, params, state, ctx, K):
        B = ctx.tokens.shape[0]
        drafts = lookup(ctx.tokens, ctx.length, ctx.active, state.group[:B], state.bank[:B], K,
                        self.min_n, self.max_n)
        return Proposal(drafts, None, state)
