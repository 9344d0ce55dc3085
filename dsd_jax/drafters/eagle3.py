"""Method "eagle3": an EAGLE-3 head (`dsd_jax.models.eagle3`) fed by the target's hidden
states; the engine is given the head as `draft=` (`models.load_eagle3(dir or "builtin")`),
or loads the one `SpecConfig.model` names (unset: the built-in head, for the built-in
target only).

Head position p reads the target's feature of token x_p and the embedding of x_{p+1};
its output there proposes x_{p+2}. With length L (pending token x_{L-1}, target KV
0..L-2), every feature up to L-2 is known, so the head's cache can hold true entries
0..L-2. State per slot:
  features  the target's aux hidden states by position (stored by `observe` after every
            target forward, K = 0 rounds included: storing, the head does not run);
  kv        the head's one-layer cache; entries 0..length-1 are true (computed from
            target features), entries past them are the last round's drafts;
  length    how far the true entries reach (it lags after K = 0 rounds).
A round with K drafts: catch up in chunks to L-2-K (zero iterations unless K = 0 rounds
or a lower K left a larger lag), re-run a K+1 window ending at L-2 (after a round the lag
is n_accepted + 1 <= K + 1), whose last output gives d_1; then d_2..d_K feed the head's own
pre-norm output back at positions L-1, L, ... in a `scan`. Drafts map to target ids
(`d2t`); q over the target vocabulary is 0 outside the draft vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from dsd_jax.drafters.base import DraftContext, Drafter, Proposal, draft_chain, gather_tokens
from dsd_jax.models import KVCache, init_kv_cache
from dsd_jax.models.eagle3 import Eagle3Config
from dsd_jax.models.transformer import embedding_of


class Eagle3State(NamedTuple):
    kv: KVCache  # one layer [num_slots, Hkv, capacity, D]
    features: jax.Array  # [num_slots, capacity, F] target aux hidden states by position
    length: jax.Array  # [num_slots] int32: head entries 0..length-1 are true


@functools.lru_cache(maxsize=1)
def _builtin_target_config():
    from dsd_jax.models.builtin import BUILTIN_DIR
    from dsd_jax.models.checkpoint import load_config
    return load_config(BUILTIN_DIR / "target")


def _is_builtin_target(config) -> bool:
    """`config` is the built-in target's, in any dtype (the built-in head was trained for it)."""
    from dsd_jax.models import ModelConfig
    builtin = _builtin_target_config()
    return isinstance(config, ModelConfig) and config.replace(dtype=builtin.dtype) == builtin


def _gather_rows(x, rows, positions):
    """x [N, S, F], rows [B] (None: 0..B-1), positions [B, T] -> [B, T, F] (clamped)."""
    pos = jnp.clip(positions, 0, x.shape[1] - 1)
    rows = jnp.arange(positions.shape[0]) if rows is None else rows
    return x[rows[:, None], pos]


@dataclasses.dataclass(frozen=True, eq=False)
class Eagle3(Drafter):
    needs_model = True
    needs_features = True
    keeps_positions = True
    shares_programs = True

    graph: Any = None  # nnx.GraphDef of the head
    config: Any = None  # its Eagle3Config
    mode: str = "sample"  # "sample" | "argmax" | "coupled", as the draft model
    catchup_chunk: int = 32
    backend: str = "auto"

    @classmethod
    def build(cls, spec, model=None, backend="auto"):
        graph, config = model
        if not isinstance(config, Eagle3Config):
            raise ValueError(f"method 'eagle3' needs an EAGLE-3 head as the draft "
                             f"(dsd_jax.models.load_eagle3(dir or 'builtin')), got a model with "
                             f"{type(config).__name__}")
        mode = "coupled" if spec.acceptance == "drafter_invariant" else spec.draft_sampling
        return cls(graph=graph, config=config, mode=mode, backend=backend)

    @staticmethod
    def load_model(spec, target_config=None, dtype: str | None = None):
        """The head `spec.model` names, for `SpecEngine` given no `draft=`, in the target's
        dtype (`target_config`; float32 without one). Unset or "builtin": the built-in head,
        which was trained for the built-in target, so only for a target of its configuration
        (or none given); for another target, an error asking for `model=` or `draft=` (a
        target of the same hidden size would run it, accepting next to nothing)."""
        from dsd_jax.models.eagle3 import load_eagle3
        dtype = dtype or getattr(target_config, "dtype", "float32")
        builtin = spec.model in (None, "builtin")
        if builtin and target_config is not None and not _is_builtin_target(target_config):
            raise ValueError("method 'eagle3' needs an EAGLE-3 head trained for this target: pass "
                             "SpecConfig(model=<head directory>) or draft=dsd_jax.models.load_eagle3(<dir>) "
                             "(the built-in head, the default, fits only the built-in target)")
        return load_eagle3(spec.model or "builtin", dtype=dtype)

    @property
    def num_features(self) -> int:
        return len(self.config.aux_layers or (0, 0, 0)) * self.config.hidden_size

    def init_state(self, num_slots, capacity):
        return Eagle3State(init_kv_cache(self.config, num_slots, capacity),
                           jnp.zeros((num_slots, capacity, self.num_features), self.config.jnp_dtype),
                           jnp.zeros((num_slots,), jnp.int32))

    def bind_params(self, draft_params, target_graph, target_params):
        return draft_params, embedding_of(target_graph, target_params)  # the shared embedding

    def feature_layers(self, target_config):
        return self.config.target_aux_layers(target_config)

    def observe(self, state, features, positions, rows=None):
        rows = jnp.arange(positions.shape[0]) if rows is None else rows
        at = jnp.where(positions >= 0, positions, state.features.shape[1])  # -1: dropped
        return state._replace(features=state.features.at[rows[:, None], at].set(
            features.astype(state.features.dtype), mode="drop"))

    def _head(self, params, h, tokens, positions, kv, rows=None):
        head_params, embed = params
        return nnx.merge(self.graph, head_params)(h, tokens, positions, kv, embed, rows=rows,
                                                  attn_backend=self.backend)

    def _true_entries(self, params, state, tokens, positions, kv, rows=None):
        """Head entries at `positions` [B, T] (-1: skip) from the stored target features and
        the tokens after them (`tokens` [B, S] of the same rows)."""
        head = nnx.merge(self.graph, params[0])
        h = head.project(_gather_rows(state.features, rows, positions))
        return self._head(params, h, gather_tokens(tokens, positions + 1), positions, kv, rows)

    def prefill(self, params, state, chunk, positions, rows):
        # Model position pos >= 1 completes head entry pos-1 (feature f_{pos-1}, stored by
        # `observe` from this or the previous chunk; next token = this chunk's token). The
        # last entry, L-2, waits for the first round's window (it needs the pending token).
        p = jnp.where(positions >= 1, positions - 1, -1)
        head = nnx.merge(self.graph, params[0])
        h = head.project(_gather_rows(state.features, rows, p))
        _, _, kv = self._head(params, h, chunk, p, state.kv, rows)
        return state._replace(kv=kv)

    def admit(self, state, rows, lengths):
        return state._replace(length=state.length.at[rows].set(
            jnp.maximum(lengths - 2, 0).astype(jnp.int32), mode="drop"))

    def propose(self, params, state, ctx: DraftContext, K: int) -> Proposal:
        B, chunk = ctx.length.shape[0], self.catchup_chunk
        length, active = ctx.length, ctx.active
        head = nnx.merge(self.graph, params[0])

        # catch up to L-2-K (the window below re-reads the last K+1 entries)
        def remaining(hl):
            return jnp.where(active, length - 2 - K - hl, 0)

        def body(carry):
            hl, kv = carry
            n = jnp.clip(remaining(hl), 0, chunk)
            pos = hl[:, None] + jnp.arange(chunk)
            pos = jnp.where(jnp.arange(chunk) < n[:, None], pos, -1)
            _, _, kv = self._true_entries(params, state, ctx.tokens, pos, kv)
            return hl + n, kv

        _, kv = lax.while_loop(lambda c: jnp.max(remaining(c[0])) > 0, body,
                               (state.length[:B], state.kv))

        # window L-2-K .. L-2: true entries; its last output proposes d_1 (token position L)
        pos = length[:, None] - 2 - K + jnp.arange(K + 1)
        pos = jnp.where((pos >= 0) & active[:, None], pos, -1)
        h, logits, kv = self._true_entries(params, state, ctx.tokens, pos, kv)
        # L = 1 (a one-token prompt): no feature exists yet; propose from neutral logits
        # rather than whatever an empty attention gives (q must stay a distribution)
        has_feature = pos[:, -1] >= 0
        h = jnp.where(has_feature[:, None], h[:, -1], 0).astype(h.dtype)
        logits = jnp.where(has_feature[:, None], logits[:, -1], 0.0)

        def advance(carry, prev, i):
            kv, h = carry
            p = jnp.where(active, length - 2 + i, -1)[:, None]
            h, logits, kv = self._head(params, h[:, None], prev[:, None], p, kv)
            return (kv, h[:, 0]), head.target_logits(logits[:, 0])

        drafts, q, (kv, _) = draft_chain(self.mode, ctx, K, head.target_logits(logits), advance, (kv, h))
        hl = state.length[:B]
        hl = jnp.where(active, jnp.maximum(hl, length - 1), hl)  # true entries 0..L-2 now
        return Proposal(drafts, q, state._replace(kv=kv, length=state.length.at[:B].set(hl)))
