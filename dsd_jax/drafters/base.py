"""The interface every speculative method implements, and the method "none".

A drafter is built once per engine (`Drafter.build`) and its hooks are traced into the
compiled programs; everything that changes at run time arrives as arguments (the draft
params, the drafter's state, the round's context), so new weights never recompile.

The step program calls, per round with K > 0 drafts over slots 0..B-1:
  `catch_up` (bring the drafter's state up to the committed tokens),
  `propose` (K drafts, with their distribution q or None for one-hot q),
and, after verification, `commit` (what the accepted prefix means for the state).
Prefill calls `prefill` on each prompt chunk and admission calls `admit`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp


class DraftContext(NamedTuple):
    """What a drafter sees in one round: rows 0..B-1 of the decode state."""

    tokens: jax.Array  # [B, capacity] int32; tokens[:, :length] are committed
    length: jax.Array  # [B] int32; the last committed token is pending (not yet verified)
    active: jax.Array  # [B] bool
    temperature: jax.Array  # [B] float32 (0 = greedy)
    top_k: jax.Array  # [B] int32
    top_p: jax.Array  # [B] float32
    seed: jax.Array  # [B] uint32


class Proposal(NamedTuple):
    drafts: jax.Array  # [B, K] int32
    q: jax.Array | None  # [B, K, V] float32, or None: one-hot q (drafts are deterministic)
    state: Any  # the drafter's state after proposing


def gather_tokens(tokens, positions):
    """tokens [B, S], positions [B, T] (may be out of range) -> [B, T]."""
    return jnp.take_along_axis(tokens, jnp.clip(positions, 0, tokens.shape[1] - 1), axis=1)


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, usable as static
class Drafter:
    """Base class: a method with no state whose hooks do nothing.

    State: any pytree whose leaves have the slot axis first (`[num_slots, ...]`), so
    moving a request between slots moves its drafter state too; None for none.
    """

    needs_model: ClassVar[bool] = False  # SpecEngine must be given `draft=`

    @classmethod
    def build(cls, spec, model=None, backend: str = "auto") -> "Drafter":
        """spec: `SpecConfig`; model: `(graphdef, ModelConfig)` of the draft model when
        `needs_model`; backend: the kernels backend of the engine."""
        return cls()

    def init_state(self, num_slots: int, capacity: int) -> Any:
        return None

    def prefill(self, params, state, chunk, positions, rows):
        """A prompt chunk [N, C] at `positions` [N, C] (-1: skip) of slots `rows` [N]."""
        return state

    def admit(self, state, rows, lengths):
        """Slots `rows` [N] (out of range: padding) now hold `lengths` [N] committed tokens,
        all but the pending last one prefilled (also used to reset slots)."""
        return state

    def catch_up(self, params, state, ctx: DraftContext):
        return state

    def propose(self, params, state, ctx: DraftContext, K: int) -> Proposal:
        raise NotImplementedError(f"{type(self).__name__} does not propose drafts")

    def commit(self, state, ctx: DraftContext, K: int, n_accepted, new_length):
        """After verification: n_accepted [B] drafts were accepted, length is now new_length [B]."""
        return state


class NoDrafter(Drafter):
    """Method "none": plain decoding; K is always 0, so `propose` is never traced."""
