"""Device state of all decode slots, donated to every compiled program.

Per slot s (one request): `tokens[s, :length[s]]` are committed. The target KV cache
holds positions 0..length-2; the last committed token is *pending* (the target has
not processed it yet). `drafter` is the speculative method's own state (for a draft
model its KV cache and how far it holds; see `dsd_jax.drafters`).
Buffers are `capacity = max_seq_len + max_k + 1` long so a verify window never
writes past the end (and the scatters drop anything that would).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dsd_jax.bad_words import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS
from dsd_jax.models import KVCache, ModelConfig, init_kv_cache
from dsd_jax.penalties import Penalties
from dsd_jax.sampling import MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS

MAX_STOP_IDS = 8


class DecodeState(NamedTuple):
    tokens: jax.Array  # [N, capacity] int32
    length: jax.Array  # [N] int32 committed tokens
    limit: jax.Array  # [N] int32 length at which the request finishes ("length")
    min_length: jax.Array  # [N] int32 length before which stop ids are banned (min_tokens)
    prompt_length: jax.Array  # [N] int32: tokens[:prompt_length] are the prompt (penalties)
    active: jax.Array  # [N] bool: live and not finished on device
    temperature: jax.Array  # [N] float32 (0 = greedy)
    top_k: jax.Array  # [N] int32 (0 = off)
    top_p: jax.Array  # [N] float32
    min_p: jax.Array  # [N] float32 (0 = off)
    repetition_penalty: jax.Array  # [N] float32 (1 = off)
    presence_penalty: jax.Array  # [N] float32 (0 = off)
    frequency_penalty: jax.Array  # [N] float32 (0 = off)
    bias_ids: jax.Array  # [N, MAX_LOGIT_BIAS] int32: logit_bias' token ids, -1 = unused
    bias_values: jax.Array  # [N, MAX_LOGIT_BIAS] float32: their biases
    bad_words: jax.Array  # [N, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS] int32 (`dsd_jax.bad_words.rows`)
    allowed_ids: jax.Array  # [N, MAX_ALLOWED_TOKEN_IDS] int32: allowed_token_ids, -1 = unused (all: any id)
    seed: jax.Array  # [N] uint32
    stop_ids: jax.Array  # [N, MAX_STOP_IDS] int32, -1 = unused
    accepted_per_pos: jax.Array  # [max_k] int32 drafts accepted at position i (cumulative)
    proposed_per_pos: jax.Array  # [max_k] int32 drafts proposed at position i (cumulative)
    target_kv: KVCache
    drafter: Any  # the drafter's state: a pytree with the slot axis first, or None

    def penalties(self, B: int):
        """Rows 0..B-1's penalty settings."""
        return Penalties(self.repetition_penalty[:B], self.presence_penalty[:B],
                         self.frequency_penalty[:B])

    @property
    def num_slots(self) -> int:
        return self.tokens.shape[0]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]


def init_state(target_cfg: ModelConfig, drafter, num_slots: int, capacity: int,
               max_k: int) -> DecodeState:
    """drafter: the engine's `dsd_jax.drafters.base.Drafter` (it sizes its own state)."""
    # Distinct buffers per field: donation rejects one buffer passed twice.
    zeros_i = lambda: jnp.zeros((num_slots,), jnp.int32)
    return DecodeState(
        tokens=jnp.zeros((num_slots, capacity), jnp.int32),
        length=zeros_i(),
        limit=zeros_i(),
        min_length=zeros_i(),
        prompt_length=zeros_i(),
        active=jnp.zeros((num_slots,), bool),
        temperature=jnp.zeros((num_slots,), jnp.float32),
        top_k=zeros_i(),
        top_p=jnp.ones((num_slots,), jnp.float32),
        min_p=jnp.zeros((num_slots,), jnp.float32),
        repetition_penalty=jnp.ones((num_slots,), jnp.float32),
        presence_penalty=jnp.zeros((num_slots,), jnp.float32),
        frequency_penalty=jnp.zeros((num_slots,), jnp.float32),
        bias_ids=jnp.full((num_slots, MAX_LOGIT_BIAS), -1, jnp.int32),
        bias_values=jnp.zeros((num_slots, MAX_LOGIT_BIAS), jnp.float32),
        bad_words=jnp.full((num_slots, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, jnp.int32),
        allowed_ids=jnp.full((num_slots, MAX_ALLOWED_TOKEN_IDS), -1, jnp.int32),
        seed=jnp.zeros((num_slots,), jnp.uint32),
        stop_ids=jnp.full((num_slots, MAX_STOP_IDS), -1, jnp.int32),
        accepted_per_pos=jnp.zeros((max(max_k, 1),), jnp.int32),
        proposed_per_pos=jnp.zeros((max(max_k, 1),), jnp.int32),
        target_kv=init_kv_cache(target_cfg, num_slots, capacity),
        drafter=drafter.init_state(num_slots, capacity),
    )


def abstract_state(*args, **kwargs) -> DecodeState:
    """Shapes and dtypes of `init_state(...)` without allocating, for AOT lowering."""
    return jax.eval_shape(lambda: init_state(*args, **kwargs))
