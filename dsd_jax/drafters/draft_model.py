"""Method "draft_model": a smaller model of `dsd_jax.models` sharing the tokenizer.

Its cache may lag behind the committed tokens (after K = 0 rounds it is not run at all),
so a round first catches up by chunked prefill, re-reads a two-token window ending at the
pending token, then proposes d_1..d_K one token at a time in a `scan`. A prompt can be
caught up that way too (`catches_up_prompts`): the engine prefills the draft at admission
only when its controller is about to speculate, so where it keeps K = 0 the draft model
never runs (that prefill had cost a draft-model engine held at K = 0 3% against plain
decoding at B = 32: `benchmarks/results/lazy_draft_prefill`).

Its embedding may have another number of rows than the target's (one tokenizer padded to
another size). Its logits are then taken over the target's vocabulary: rows the draft
lacks get probability 0, ids past the target's are dropped, so drafts and q always live
in the target's vocabulary and rejection sampling stays exact (drafter-invariant mode
still draws the target's noise at the same ids). A token the draft has no embedding for
(the target emitting a padding id) is fed to it as its last id, not as NaN.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from dsd_jax.drafters.base import DraftContext, Drafter, Proposal, draft_chain, gather_tokens
from dsd_jax.models import KVCache, forward, init_kv_cache
from dsd_jax.models.eagle3 import Eagle3Config
from dsd_jax.models.transformer import embedding_of

WINDOW = 2  # tokens the draft re-reads each round: after an all-accepted round it lags by 2


class DraftParams(NamedTuple):
    model: Any  # the draft model's params
    target_vocab: int  # static: the vocabulary drafts and q live in


def to_vocab(logits, vocab: int):
    """Logits [..., V] over the first `vocab` ids: cut, or padded with -inf."""
    v = logits.shape[-1]
    if v >= vocab:
        return logits[..., :vocab]
    return jnp.pad(logits, [(0, 0)] * (logits.ndim - 1) + [(0, vocab - v)], constant_values=-jnp.inf)


class DraftModelState(NamedTuple):
    kv: KVCache  # per layer [num_slots, Hkv, capacity, D]
    length: jax.Array  # [num_slots] int32 positions the draft cache holds (may lag)


@dataclasses.dataclass(frozen=True, eq=False)
class DraftModel(Drafter):
    needs_model = True
    catches_up_prompts = True
    keeps_positions = True
    any_vocab_size = True
    shares_programs = True

    graph: Any = None  # nnx.GraphDef of the draft model
    config: Any = None  # its ModelConfig
    mode: str = "sample"  # "sample" (d ~ q, q kept) | "argmax" (one-hot q) | "coupled"
    catchup_chunk: int = 32
    backend: str = "auto"

    @classmethod
    def build(cls, spec, model=None, backend="auto"):
        graph, config = model
        if isinstance(config, Eagle3Config):  # "draft_model" is the default method
            raise ValueError("method 'draft_model' was given an EAGLE-3 head as the draft; use "
                             "SpecConfig(method='eagle3') for a head, or a dsd_jax.models "
                             "Transformer for 'draft_model'")
        # drafter-invariant acceptance couples the draft to the target's noise
        mode = "coupled" if spec.acceptance == "drafter_invariant" else spec.draft_sampling
        return cls(graph=graph, config=config, mode=mode, backend=backend)

    def init_state(self, num_slots, capacity):
        return DraftModelState(init_kv_cache(self.config, num_slots, capacity),
                               jnp.zeros((num_slots,), jnp.int32))

    def bind_params(self, draft_params, target_graph, target_params):
        return DraftParams(draft_params, embedding_of(target_graph, target_params).shape[0])

    def _forward(self, params, tokens, positions, kv, rows=None):
        own = self.config.vocab_size
        if params.target_vocab > own:
            tokens = jnp.minimum(tokens, own - 1)
        logits, kv = forward(self.graph, params.model, tokens, positions, kv, rows=rows,
                             attn_backend=self.backend)
        return to_vocab(logits, params.target_vocab), kv

    def prefill(self, params, state, chunk, positions, rows):
        _, kv = self._forward(params, chunk, positions, state.kv, rows=rows)
        return state._replace(kv=kv)

    def admit(self, state, rows, lengths):
        # prefill wrote every prompt position but the pending last one
        return state._replace(length=state.length.at[rows].set(
            jnp.maximum(lengths - 1, 0).astype(jnp.int32), mode="drop"))

    def catch_up(self, params, state, ctx: DraftContext):
        """Chunked prefill of the draft cache up to `length - WINDOW`, for every row whatever
        its lag; zero iterations in the common case."""
        B, chunk = ctx.length.shape[0], self.catchup_chunk

        def remaining(dl):
            return jnp.where(ctx.active, ctx.length - WINDOW - dl, 0)

        def body(carry):
            dl, kv = carry
            n = jnp.clip(remaining(dl), 0, chunk)
            pos = dl[:, None] + jnp.arange(chunk)
            toks = gather_tokens(ctx.tokens, pos)
            pos = jnp.where(jnp.arange(chunk) < n[:, None], pos, -1)
            _, kv = self._forward(params, toks, pos, kv)
            return dl + n, kv

        dl, kv = lax.while_loop(lambda c: jnp.max(remaining(c[0])) > 0, body,
                                (state.length[:B], state.kv))
        return DraftModelState(kv, state.length.at[:B].set(dl))

    def propose(self, params, state, ctx: DraftContext, K: int) -> Proposal:
        B, length, active = ctx.length.shape[0], ctx.length, ctx.active
        pos = length[:, None] - WINDOW + jnp.arange(WINDOW)
        toks = gather_tokens(ctx.tokens, pos)
        pos = jnp.where((pos >= 0) & active[:, None], pos, -1)
        logits, kv = self._forward(params, toks, pos, state.kv)

        def advance(kv, prev, i):
            p = jnp.where(active, length - 1 + i, -1)[:, None]
            logits, kv = self._forward(params, prev[:, None], p, kv)
            return kv, logits[:, 0]

        drafts, q, kv = draft_chain(self.mode, ctx, K, logits[:, -1], advance, kv)
        # The draft cache now holds everything up to the pending token (position length-1).
        dl = state.length[:B]
        dl = jnp.where(active, jnp.maximum(dl, length), dl)
        return Proposal(drafts, q, DraftModelState(kv, state.length.at[:B].set(dl)))

    def commit(self, state, ctx, K, n_accepted, new_length):
        # fed drafts d_1..d_{K-1} are valid in the draft cache up to the first rejection
        B = ctx.length.shape[0]
        dl = jnp.minimum(state.length[:B] + jnp.minimum(n_accepted, K - 1), new_length)
        return state._replace(length=state.length.at[:B].set(dl))
