"""The interface every speculative method implements, and the method "none".

A drafter is built once per engine (`Drafter.build`) and its hooks are traced into the
compiled programs; everything that changes at run time arrives as arguments (the draft
params, the drafter's state, the round's context), so new weights never recompile.

The step program calls, per round with K > 0 drafts over slots 0..B-1:
  `catch_up` (bring the drafter's state up to the committed tokens),
  `propose` (K drafts, with their distribution q or None for one-hot q),
and, after verification, `commit` (what the accepted prefix means for the state).
Prefill calls `prefill` on each prompt chunk (for the rows that take it now, see
`catches_up_prompts`) and admission calls `admit`.

A drafter fed by the target's hidden states (EAGLE heads) sets `needs_features`: the
target forward of every prefill chunk and every round (K = 0 included) then also returns
the residual inputs to `feature_layers(...)`, handed to `observe` before anything else
runs on them. `bind_params` lets a drafter read target weights it shares (the embedding).
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
    stop_ids: jax.Array | None = None  # [B, MAX_STOP_IDS] int32 (-1: unused); None: no ban
    min_length: jax.Array | None = None  # [B] int32: stop ids are banned below it (min_tokens)
    min_p: jax.Array | None = None  # [B] float32 (None: 0, off)
    bias_ids: jax.Array | None = None  # [B, MAX_LOGIT_BIAS] int32 logit_bias ids (-1: unused); None: none
    bias_values: jax.Array | None = None  # [B, MAX_LOGIT_BIAS] float32
    penalties: Any = None  # `penalties.Penalties` of [B] settings; None: none
    prompt_length: jax.Array | None = None  # [B] int32 (the penalties' and bad words' prompt)
    bad_words: jax.Array | None = None  # [B, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS] (`dsd_jax.bad_words`)
    allowed_ids: jax.Array | None = None  # [B, MAX_ALLOWED_TOKEN_IDS] allowed_token_ids (-1: unused)


class AdmissionRequest(NamedTuple):
    """What the host knows of a request a drafter may need at admission (host values)."""

    group: int  # requests sharing a prompt (`SamplingParams.n`) share the group id
    prompt: list  # token ids
    references: list  # earlier continuations of the same prompt (lists of token ids)


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
    needs_features: ClassVar[bool] = False  # the target returns `feature_layers` to `observe`
    # drafts from `AdmissionRequest.references` (earlier rollouts): under rejection
    # acceptance the engine then mixes them into the request's noise seed
    reads_references: ClassVar[bool] = False
    # True: `catch_up` can take in a whole prompt, so admission may leave it out (the engine
    # does when its controller is not about to speculate) and a run kept at K = 0 (large
    # batches) never pays for the drafter
    catches_up_prompts: ClassVar[bool] = False
    # True: its state holds something per token position (a KV cache, the target's
    # features), good below the length `admit` is given, and each round with K > 0 catches
    # it up from there: a shared prefix brings the donor's state along, and a taker whose
    # donor's state may lag is admitted with the length known good (`dsd_jax.prefix_sharing`)
    keeps_positions: ClassVar[bool] = False
    # True: the draft model's vocabulary may be another size than the target's (one
    # tokenizer, padded differently: Qwen2.5-0.5B has 151936 rows, Qwen2.5-7B 152064)
    any_vocab_size: ClassVar[bool] = False
    # True: the programs read nothing of the drafter but its type and dataclass fields, so
    # engines whose drafters are equal so share compiled programs (`dsd_jax.shared_programs`).
    # Read from the class itself, not inherited: a subclass may read more
    shares_programs: ClassVar[bool] = False

    @classmethod
    def build(cls, spec, model=None, backend: str = "auto") -> "Drafter":
        """spec: `SpecConfig`; model: `(graphdef, ModelConfig)` of the draft model when
        `needs_model`; backend: the kernels backend of the engine."""
        return cls()

    def program_key(self):
        """What the compiled programs depend on of this drafter (hashable), or None: not
        shared with another engine's."""
        if not type(self).__dict__.get("shares_programs", False):
            return None
        return (type(self),) + tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def init_state(self, num_slots: int, capacity: int) -> Any:
        return None

    def bind_params(self, draft_params, target_graph, target_params):
        """The `params` every other hook receives (default: the draft params). Runs inside
        the compiled program, so target weights a drafter shares cost nothing to pass."""
        return draft_params

    def feature_layers(self, target_config) -> tuple[int, ...]:
        """needs_features: target layers whose residual inputs `observe` receives (static)."""
        return ()

    def observe(self, state, features, positions, rows=None):
        """needs_features: the target computed `features` [N, T, F] at `positions` [N, T]
        (-1: none) of slots `rows` (None: 0..N-1). Every prefill chunk and every round,
        K = 0 included, so this should only store (K = 0 must not run the drafter)."""
        return state

    def prefill(self, params, state, chunk, positions, rows):
        """A prompt chunk [N, C] at `positions` [N, C] (-1: skip) of slots `rows` [N]."""
        return state

    def admit(self, state, rows, lengths):
        """Slots `rows` [N] (out of range: padding) now hold `lengths` [N] committed tokens,
        all but the pending last one in the drafter's state (also used to reset slots; rows
        whose prompt was left to `catch_up` get lengths of 1). A drafter with
        `admission_fields` gets a 4th argument: {name: [N, ...] array} of them."""
        return state

    def admission_fields(self) -> dict:
        """Per-request host data to hand `admit`: name -> (shape per request, numpy dtype,
        padding value). The engine fills each from `admission_value`."""
        return {}

    def admission_value(self, name: str, request: "AdmissionRequest"):
        """The value of field `name` for one admitted request (an array of its shape)."""
        raise NotImplementedError(f"{type(self).__name__} declares no admission field {name!r}")

    def catch_up(self, params, state, ctx: DraftContext):
        return state

    def propose(self, params, state, ctx: DraftContext, K: int) -> Proposal:
        raise NotImplementedError(f"{type(self).__name__} does not propose drafts")

    def commit(self, state, ctx: DraftContext, K: int, n_accepted, new_length):
        """After verification: n_accepted [B] drafts were accepted, length is now new_length [B]."""
        return state


class NoDrafter(Drafter):
    """Method "none": plain decoding; K is always 0, so `propose` is never traced."""

    shares_programs = True


def sample_proposal(mode: str, logits, position, ctx: DraftContext, drafted=None):
    """One draft token per row from a drafter's target-vocabulary logits [B, V] for the
    token at `position` [B] -> (token [B], q [B, V] or None = one-hot q). drafted [B, J]:
    the row's proposals before this one this round (-1: none; None: none at all).

    mode "sample": d ~ q, q kept; "argmax": one-hot q; "coupled" (drafter-invariant):
    argmax(log q + the target's noise at that position). Greedy rows take the argmax in
    every mode (q is then one-hot, as the target's p).
    """
    from dsd_jax import bad_words, penalties, sampling

    # the target keeps a row's allowed ids, biases and penalises logits, and bans stop ids
    # before min_tokens and bad words' last tokens: a draft the target's adjustments push
    # away would only be rejected
    drafted = jnp.zeros((logits.shape[0], 0), jnp.int32) if drafted is None else drafted
    if ctx.allowed_ids is not None:
        logits = sampling.allowed_logits(logits, ctx.allowed_ids, ctx.active)
    if ctx.bias_ids is not None:
        logits = sampling.biased_logits(logits, ctx.bias_ids, ctx.bias_values, ctx.active)
    if ctx.penalties is not None:
        logits = penalties.penalised_draft_logits(logits, ctx.penalties, ctx.active, ctx.tokens,
                                                  ctx.prompt_length, ctx.length, drafted)
    banned = (None if ctx.min_length is None
              else sampling.banned_ids(ctx.stop_ids, position[:, None], ctx.min_length)[:, 0])
    if ctx.bad_words is not None:
        made = (position - ctx.length)[:, None]  # the proposals before this one
        bad = bad_words.banned_by_bad_words(ctx.bad_words, ctx.active, ctx.tokens, ctx.prompt_length,
                                            ctx.length, drafted, made)[:, 0]
        banned = bad if banned is None else jnp.concatenate([banned, bad], axis=-1)
    if mode == "argmax":
        proc = sampling.processed_logits(logits, ctx.temperature, ctx.top_k, ctx.top_p, banned, ctx.min_p)
        return jnp.argmax(proc, axis=-1).astype(jnp.int32), None
    keep_q = mode == "sample"

    def exact(_):
        proc = sampling.processed_logits(logits, ctx.temperature, ctx.top_k, ctx.top_p, banned, ctx.min_p)
        stream = sampling.STREAM_TARGET if mode == "coupled" else sampling.STREAM_DRAFT
        noise = sampling.noise_if_sampling(ctx.temperature, lambda: sampling.gumbel_noise(
            ctx.seed, position[:, None], stream, logits.shape[-1])[:, 0])
        token = sampling.gumbel_argmax(proc, noise, ctx.temperature)
        return token, sampling.probs_from_processed(proc, ctx.temperature) if keep_q else None

    def greedy(scored):  # what `exact` gives when every live row is greedy and unfiltered
        token = jnp.argmax(scored, axis=-1).astype(jnp.int32)
        return token, jax.nn.one_hot(token, logits.shape[-1], dtype=jnp.float32) if keep_q else None

    # the sampling tail is a large share of a small drafter's step: skip it where it is moot
    unfiltered_greedy = sampling.plain_greedy(ctx.active, ctx.temperature, ctx.top_k, ctx.top_p, ctx.min_p)
    if banned is None:
        return jax.lax.cond(unfiltered_greedy, lambda _: greedy(logits), exact, None)
    plain = unfiltered_greedy & ~sampling.bans_any(ctx.active, banned)

    def banning_greedy(_):
        return greedy(sampling.suppress(logits.astype(jnp.float32), banned))
    return jax.lax.switch(jnp.where(plain, 0, jnp.where(unfiltered_greedy, 1, 2)),
                          (lambda _: greedy(logits), banning_greedy, exact), None)


def draft_chain(mode: str, ctx: DraftContext, K: int, logits, advance, carry):
    """K drafts one after another, each fed back: d_1 from `logits` [B, V] (the token at
    position ctx.length), then for i = 1..K-1 `advance(carry, d_i, i)` -> (carry, logits
    [B, V] for the token at ctx.length + i) gives d_{i+1}. Each proposal sees the ones
    before it (the penalties count them). Returns (drafts [B, K], q [B, K, V] or None, carry).
    """
    first, q_first = sample_proposal(mode, logits, ctx.length, ctx)

    def body(c, i):
        carry, prev, drafted = c
        drafted = drafted.at[:, i - 1].set(prev)  # d_1..d_i
        carry, logits = advance(carry, prev, i)
        token, q = sample_proposal(mode, logits, ctx.length + i, ctx, drafted)
        return (carry, token, drafted), (token, q)

    none_yet = jnp.full((ctx.length.shape[0], K), -1, jnp.int32)  # K, not K - 1: traced at K = 1 too
    (carry, _, _), (rest, q_rest) = jax.lax.scan(body, (carry, first, none_yet), jnp.arange(1, K))
    drafts = jnp.concatenate([first[:, None], jnp.moveaxis(rest, 0, 1)], axis=1)
    q = None if q_first is None else jnp.concatenate([q_first[:, None], jnp.moveaxis(q_rest, 0, 1)], axis=1)
    return drafts, q, carry
