"""Refreshing a stale draft from the rollouts themselves.

In RL the policy (the target) moves every step and a frozen draft falls behind: its
acceptance drops (users of other engines report accept length falling to 1.0). The
completed rollouts are exactly the text the draft must predict next, and the target's
distributions over them are one forward away, so between RL steps a few optax steps of

    loss = KL(p_target || q_draft)  at temperature T, over the completion positions

bring the draft back (`DraftDistiller.refresh(engine, outputs)`), and
`engine.set_params(draft=...)` swaps it in without recompiling anything.

Also here: `sequence_logits`, a full-sequence forward over padded rows (positions from the
mask, so left padding shifts nothing), and `token_logps`, the per-token log-probabilities
of completions in Tunix's `compute_per_token_logps` convention.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dsd_jax.models.eagle3 import Eagle3Head
from dsd_jax.models.transformer import Transformer, rope_cos_sin


def sequence_logits(model, tokens, mask):
    """float32 logits [B, T, V] of tokens [B, T] where `mask` [B, T] marks real tokens.

    Real tokens take positions 0, 1, ... in order (Tunix's `build_positions_from_mask`) and
    attend causally to real tokens only; outputs at padding are finite garbage."""
    cfg = model.config
    mask = mask.astype(bool)
    count = jnp.cumsum(mask, axis=-1)
    positions = count - (count >= 1)
    cos, sin = rope_cos_sin(cfg, positions)
    T = tokens.shape[1]
    allowed = jnp.tril(jnp.ones((T, T), bool))[None] & mask[:, None, :]  # [B, Tq, Tk]
    x = jnp.take(model.embed[...], tokens, axis=0)
    for layer in model.layers:
        q, k, v = layer.qkv(cfg, x, cos, sin)
        attn = jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None], implementation="xla")
        x = layer.finish(cfg, x, attn.astype(x.dtype))
    return model.logits(x)


def token_logps(model, prompt_tokens, completion_tokens, pad_id, temperature=1.0):
    """[B, C] log-probability of each completion token given everything before it, as
    Tunix's `common.compute_per_token_logps`: prompts left-padded, completions
    right-padded, masks from `pad_id`, logits divided by `temperature` unless it is 0 or 1."""
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    logits = sequence_logits(model, tokens, tokens != pad_id)
    C = completion_tokens.shape[1]
    logits = logits[:, -C - 1:-1]
    t = jnp.asarray(temperature, jnp.float32)
    logits = logits / jnp.where((t == 0) | (t == 1), 1.0, t)
    picked = jnp.take_along_axis(logits, completion_tokens[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


# ---- distillation --------------------------------------------------------------------------

@dataclasses.dataclass
class RolloutBatch:
    """Right-padded rollouts: tokens [N, L], `mask` of real tokens, `loss_mask` of the
    positions whose next token is a completion token (what the draft proposes)."""

    tokens: np.ndarray
    mask: np.ndarray
    loss_mask: np.ndarray


def rollout_batch(outputs: Sequence, length_multiple: int = 32) -> RolloutBatch:
    """A `RolloutBatch` from `RequestOutput`s (prompt + completion); the width is rounded up
    to `length_multiple` so successive RL steps reuse one compiled training step."""
    rows = [(list(o.prompt_token_ids), list(o.token_ids)) for o in outputs if len(o.token_ids)]
    if not rows:
        raise ValueError("no completed tokens to distil on")
    longest = max(len(p) + len(c) for p, c in rows)
    L = -(-longest // length_multiple) * length_multiple
    tokens = np.zeros((len(rows), L), np.int32)
    mask = np.zeros((len(rows), L), bool)
    loss = np.zeros((len(rows), L), bool)
    for i, (p, c) in enumerate(rows):
        n = len(p) + len(c)
        tokens[i, :n] = p + c
        mask[i, :n] = True
        loss[i, len(p) - 1:n - 1] = True  # logits at t predict token t + 1
    return RolloutBatch(tokens, mask, loss)


def kl_loss(t_logits, d_logits, loss_mask, temperature: float):
    """Mean over `loss_mask` of KL(softmax(t / T) || softmax(d / T))."""
    T = max(float(temperature), 1e-6)
    t_logp = jax.nn.log_softmax(jax.lax.stop_gradient(t_logits) / T, axis=-1)
    d_logp = jax.nn.log_softmax(d_logits / T, axis=-1)
    kl = jnp.sum(jnp.exp(t_logp) * (t_logp - d_logp), axis=-1)
    w = loss_mask.astype(jnp.float32)
    return jnp.sum(kl * w) / jnp.maximum(jnp.sum(w), 1.0)


class DraftDistiller:
    """Trains a draft toward the target's distributions on completed rollouts, keeping the
    optimizer state from one RL step to the next.

    target, draft: the models the engine was built from (their graph definitions are used;
    the weights come from the engine at every refresh); the draft is a `Transformer` (method
    "draft_model"), not an EAGLE-3 head. `temperature`: the rollout's sampling temperature
    (acceptance compares the two distributions at it; 0 is read as 1).
    `rows`: sequences per optimizer step (a fixed shape: one compilation)."""

    def __init__(self, target, draft, *, learning_rate: float = 1e-3, temperature: float = 1.0,
                 rows: int = 16, weight_decay: float = 0.0, seed: int = 0):
        if draft is None:
            raise ValueError("DraftDistiller needs the draft model")
        if isinstance(draft, Eagle3Head):
            raise ValueError("DraftDistiller trains a draft Transformer, not an EAGLE-3 head "
                             "(method 'draft_model'; an EAGLE-3 head is trained on the target's "
                             "hidden states, which this loss does not use)")
        for role, model in (("target", target), ("draft", draft)):
            if not isinstance(model, Transformer):
                raise TypeError(f"DraftDistiller needs the {role} as a dsd_jax Transformer, got "
                                f"{type(model).__name__}")
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocab_size {draft.config.vocab_size} != target vocab_size "
                             f"{target.config.vocab_size}: distillation matches the two "
                             "distributions id by id, so it needs equal vocabularies")
        self.target_graph = nnx.graphdef(target)
        self.draft_graph = nnx.graphdef(draft)
        # what the engine's params must look like at refresh (structure, shapes, dtypes)
        self._like = {role: _abstract(nnx.state(m)) for role, m in (("target", target),
                                                                    ("draft", draft))}
        self.temperature = float(temperature) if temperature > 0 else 1.0
        self.rows = int(rows)
        self.tx = optax.adamw(learning_rate, weight_decay=weight_decay)
        self.opt_state = None
        self.rng = np.random.default_rng(seed)
        self._step = jax.jit(functools.partial(_train_step, self.target_graph, self.draft_graph,
                                               self.tx, self.temperature), donate_argnums=(1, 2))
        self._eval = jax.jit(functools.partial(_loss, self.target_graph, self.draft_graph,
                                               self.temperature))

    def fit(self, target_params, draft_params, batch: RolloutBatch, steps: int):
        """`steps` optimizer steps on random rows of `batch`; returns (new draft params,
        {"loss_before", "loss_after"} on the whole batch, first rows-sized slice)."""
        params = jax.tree.map(jnp.copy, draft_params)  # the engine's copy stays valid
        # the steps donate the optimizer state: held here and stored back only when every
        # step succeeded, so a failure leaves None (a fresh state next time), never a
        # deleted one that would fail every later call
        opt_state, self.opt_state = self.opt_state, None
        if opt_state is None:
            opt_state = self.tx.init(params)
        n = len(batch.tokens)
        take = lambda idx: (batch.tokens[idx], batch.mask[idx], batch.loss_mask[idx])
        probe = take(np.arange(self.rows) % n)
        before = float(self._eval(target_params, params, *probe))
        for _ in range(steps):
            idx = self.rng.choice(n, self.rows, replace=n < self.rows)
            params, opt_state = self._step(target_params, params, opt_state, *take(idx))
        after = float(self._eval(target_params, params, *probe))
        self.opt_state = opt_state
        dtypes = jax.tree.map(lambda x: x.dtype, draft_params)
        params = jax.tree.map(lambda x, d: x.astype(d), params, dtypes)
        return params, {"loss_before": before, "loss_after": after, "steps": steps}

    def refresh(self, engine, outputs: Sequence, steps: int = 8) -> dict:
        """Distils the engine's draft on `outputs` (its completed rollouts) against the
        engine's current target and swaps the result in (`set_params`: no recompilation).
        A ValueError when the engine has no draft model, or its models are not the ones this
        distiller was built for, or `outputs` hold no completion tokens; the engine is then
        left as it was."""
        if engine._draft_params is None:
            raise ValueError(f"this engine has no draft model to distil (method "
                             f"{engine.spec.method!r}); DraftDistiller needs method 'draft_model'")
        if engine.spec.method == "eagle3":
            raise ValueError("DraftDistiller trains a draft Transformer, not an EAGLE-3 head "
                             "(this engine's method is 'eagle3')")
        for role, params in (("target", engine._target_params), ("draft", engine._draft_params)):
            if _abstract(params) != self._like[role]:
                raise ValueError(f"the engine's {role} is not the {role} this DraftDistiller was "
                                 "built with (parameter structure, shapes or dtypes differ)")
        batch = rollout_batch(outputs)
        params, metrics = self.fit(engine._target_params, engine._draft_params, batch, steps)
        engine.set_params(draft=params)
        return metrics


def _abstract(params):
    """(tree structure, ((shape, dtype), ...)) of a param tree: cheap to compare."""
    leaves, treedef = jax.tree.flatten(params)
    return treedef, tuple((tuple(x.shape), np.dtype(x.dtype)) for x in leaves)


def _loss(t_graph, d_graph, temperature, t_params, d_params, tokens, mask, loss_mask):
    t_logits = sequence_logits(nnx.merge(t_graph, t_params), tokens, mask)
    d_logits = sequence_logits(nnx.merge(d_graph, d_params), tokens, mask)
    return kl_loss(t_logits, d_logits, loss_mask, temperature)


def _train_step(t_graph, d_graph, tx, temperature, t_params, d_params, opt_state, tokens, mask,
                loss_mask):
    t_logits = jax.lax.stop_gradient(sequence_logits(nnx.merge(t_graph, t_params), tokens, mask))

    def loss_fn(p):
        return kl_loss(t_logits, sequence_logits(nnx.merge(d_graph, p), tokens, mask), loss_mask,
                       temperature)

    grads = jax.grad(loss_fn)(d_params)
    updates, opt_state = tx.update(grads, opt_state, d_params)
    return optax.apply_updates(d_params, updates), opt_state
