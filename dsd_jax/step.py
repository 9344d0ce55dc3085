"""The device programs: one speculative step per (K, batch bucket), prefill, admit, move.

Every program is a pure function `(target_params, draft_params, state, ...) ->
(state, small outputs)` with the state donated, so the KV caches are updated in
place, and the params are arguments, so new weights never recompile.

One round with K drafts, for the first B slots:
  1. draft d_1..d_K with the drafter (`dsd_jax.drafters`): catch up, propose (K = 0
     does not run it at all),
  2. verify [pending, d_1..d_K] in one target forward -> p_1..p_{K+1},
  3. accept: rejection sampling (accept d_i w.p. min(1, p/q), recover from
     max(p - q, 0), bonus from p_{K+1}) or, drafter-invariant, Gumbel-max coupling;
     p is the target's law under each row's settings (allowed_token_ids, min_tokens' ban,
     `dsd_jax.bad_words`, logit_bias, the penalties of `dsd_jax.penalties`, both over the
     row's tokens and the drafts before each position, temperature, filters); a batch
     whose live rows are all greedy and unfiltered takes the argmax instead (of the raw
     logits unless a row restricts, bans, biases or penalises), which is what both give
     there (the sampling tail was 2% of a B=1 step),
  4. commit on device: append the accepted drafts + one emitted token, advance length,
     and tell the drafter what was accepted.
     Rejected KV entries simply sit past `length`: no copy, no rollback.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsd_jax import bad_words, kernels, penalties, sampling
from dsd_jax.drafters.base import DraftContext, Drafter, gather_tokens
from dsd_jax.models import forward
from dsd_jax.models.transformer import config_of, logits_of
from dsd_jax.state import DecodeState


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """Static choices baked into the compiled programs (the drafter's own are in it)."""

    acceptance: str = "rejection"  # rejection | drafter_invariant
    backend: str = "auto"  # kernels backend for attention and rejection sampling
    top_logprobs: int = 0  # N: each output position's N likeliest raw logprobs (0: none computed)


class StepOutput(NamedTuple):
    """One round's outputs; `spec_rounds` stacks them along a leading [R] axis."""

    tokens: jax.Array  # [B, K+1] int32: the first n_emit are new committed tokens
    n_emit: jax.Array  # [B] int32
    n_accepted: jax.Array  # [B] int32 drafts accepted (before stop/length truncation)
    done: jax.Array  # [B] bool: finished in this step
    logprobs: jax.Array  # [B, K+1] float32 under the target's sampling distribution
    raw_logprobs: jax.Array  # [B, K+1] float32 log_softmax of the raw target logits
    top_logprobs: jax.Array  # [B, K+1, N] float32: the N largest raw logprobs, largest first
    top_ids: jax.Array  # [B, K+1, N] int32: their token ids


def _target_forward(target_graph, drafter: Drafter, opts: StepOptions, target_params, tokens,
                    positions, target_kv, drafter_state, rows=None, head=True):
    """The target forward; with a feature-fed drafter it also returns the aux hidden states,
    which the drafter's `observe` stores (the flag is static: no cost otherwise). head=False
    returns the last layer's outputs in place of the logits (`models.forward`)."""
    aux = (drafter.feature_layers(config_of(target_graph, target_params))
           if drafter.needs_features else ())
    out = forward(target_graph, target_params, tokens, positions, target_kv, rows=rows,
                  attn_backend=opts.backend, aux_layers=aux, head=head)
    if aux:
        drafter_state = drafter.observe(drafter_state, out[2], positions, rows)
    return out[0], out[1], drafter_state


def _accept(opts: StepOptions, K: int, logits, penalised, drafts, q, temperature, top_k, top_p,
            min_p, seed, token_pos, banned):
    """Acceptance under the rows' sampling settings: (n_accepted, tokens, logprobs under
    the sampling distribution, logprobs of the raw logits), tokens [B, K+1]. penalised:
    the logits with the rows' penalties applied (`dsd_jax.penalties`); token_pos [B, K+1]:
    the position of the token each output decides; banned: `sampling.banned_ids`."""
    V = logits.shape[-1]
    proc = sampling.processed_logits(penalised, temperature, top_k, top_p, banned, min_p)
    target_noise = sampling.noise_if_sampling(
        temperature, lambda: sampling.gumbel_noise(seed, token_pos, sampling.STREAM_TARGET, V))
    if opts.acceptance == "drafter_invariant" or K == 0:
        # K = 0 in either mode is plain sampling with the same per-position noise.
        target_tokens = sampling.gumbel_argmax(proc, target_noise, temperature)
        n_acc, out_tokens = kernels.coupled_accept_xla(target_tokens, drafts)
    else:
        p = sampling.probs_from_processed(proc, temperature)
        uniforms = sampling.noise_if_sampling(
            temperature, lambda: sampling.uniform_noise(seed, token_pos[:, :K], sampling.STREAM_ACCEPT))
        n_acc, out_tokens = kernels.rejection_sample(p, q, drafts, uniforms, target_noise,
                                                     backend=opts.backend)
    return (n_acc, out_tokens, sampling.token_logprobs(proc, out_tokens),
            sampling.token_logprobs(logits, out_tokens))


def spec_step(target_graph, drafter: Drafter, opts: StepOptions, K: int, B: int,
              target_params, draft_params, state: DecodeState):
    """One speculative round with K drafts over slots 0..B-1."""
    tokens = state.tokens[:B]
    length, limit, active = state.length[:B], state.limit[:B], state.active[:B]
    temperature, top_k, top_p = state.temperature[:B], state.top_k[:B], state.top_p[:B]
    min_p, seed = state.min_p[:B], state.seed[:B]
    stop_ids, min_length = state.stop_ids[:B], state.min_length[:B]
    bias_ids, bias_values = state.bias_ids[:B], state.bias_values[:B]
    settings, prompt_length, bad = state.penalties(B), state.prompt_length[:B], state.bad_words[:B]
    allowed = state.allowed_ids[:B]
    ctx = DraftContext(tokens, length, active, temperature, top_k, top_p, seed, stop_ids, min_length,
                       min_p, bias_ids, bias_values, settings, prompt_length, bad, allowed)
    drafter_state = state.drafter
    params = drafter.bind_params(draft_params, target_graph, target_params)

    # 1. draft (K = 0 does not run the drafter at all)
    q = None
    if K > 0:
        drafter_state = drafter.catch_up(params, drafter_state, ctx)
        drafts, q, drafter_state = drafter.propose(params, drafter_state, ctx, K)
    else:
        drafts = jnp.zeros((B, 0), jnp.int32)

    # 2. verify (a feature-fed drafter stores the target's hidden states, whatever K)
    pending = gather_tokens(tokens, length[:, None] - 1)
    positions = jnp.where(active[:, None], length[:, None] - 1 + jnp.arange(K + 1), -1)
    logits, target_kv, drafter_state = _target_forward(
        target_graph, drafter, opts, target_params, jnp.concatenate([pending, drafts], 1),
        positions, state.target_kv, drafter_state)

    # 3. accept
    token_pos = length[:, None] + jnp.arange(K + 1)  # position of the token each output decides
    banned = jnp.concatenate([  # min_tokens not reached yet; bad words the drafts would complete
        sampling.banned_ids(stop_ids, token_pos, min_length),
        bad_words.banned_by_bad_words(bad, active, tokens, prompt_length, length, drafts,
                                      jnp.broadcast_to(jnp.arange(K + 1), (B, K + 1)))], axis=-1)

    def penalised():  # each row's allow-list, logit_bias, then its penalties (vLLM's order)
        biased = sampling.biased_logits(sampling.allowed_logits(logits, allowed, active), bias_ids,
                                        bias_values, active)
        return penalties.penalised_logits(biased, settings, active, tokens, prompt_length, length, drafts)

    def exact(_):
        return _accept(opts, K, logits, penalised(), drafts, q, temperature, top_k, top_p, min_p, seed,
                       token_pos, banned)

    def plain_greedy(_):  # every live row greedy, unfiltered, unpenalised: the same tokens, fewer ops
        n_acc, out_tokens = kernels.coupled_accept_xla(jnp.argmax(logits, -1).astype(jnp.int32), drafts)
        logprobs = sampling.token_logprobs(logits, out_tokens)
        return n_acc, out_tokens, logprobs, logprobs

    def greedy(_):  # every live row greedy and unfiltered, some banning, biasing or penalising:
        # what `exact` gives there (its processed logits are these), without temperature or noise
        scored = sampling.suppress(penalised(), banned)
        n_acc, out_tokens = kernels.coupled_accept_xla(jnp.argmax(scored, -1).astype(jnp.int32), drafts)
        return (n_acc, out_tokens, sampling.token_logprobs(scored, out_tokens),
                sampling.token_logprobs(logits, out_tokens))

    unfiltered_greedy = sampling.plain_greedy(active, temperature, top_k, top_p, min_p)
    adjusts = (sampling.bans_any(active, banned) | settings.any_on(active)
               | sampling.any_listed(bias_ids, active)
               | sampling.any_listed(allowed, active))  # a live row changes its logits before sampling
    plain = unfiltered_greedy & ~adjusts
    n_acc, out_tokens, logprobs, raw_logprobs = jax.lax.switch(
        jnp.where(plain, 0, jnp.where(unfiltered_greedy, 1, 2)), (plain_greedy, greedy, exact), None)

    if opts.top_logprobs:
        top_logprobs, top_ids = sampling.top_logprobs(logits, opts.top_logprobs)
    else:  # nothing computed; zero-width, so the outputs keep one layout
        top_logprobs, top_ids = jnp.zeros((B, K + 1, 0), jnp.float32), jnp.zeros((B, K + 1, 0), jnp.int32)

    # 4. commit
    n_emit = jnp.where(active, jnp.minimum(n_acc + 1, limit - length), 0)
    j = jnp.arange(K + 1)
    is_stop = jnp.any((out_tokens[..., None] == stop_ids[:, None, :]) & (stop_ids[:, None, :] >= 0), -1)
    is_stop &= j[None, :] < n_emit[:, None]
    has_stop = jnp.any(is_stop, axis=1)
    n_emit = jnp.where(has_stop, jnp.argmax(is_stop, axis=1) + 1, n_emit)
    new_length = length + n_emit
    done = active & (has_stop | (new_length >= limit))
    write_at = jnp.where(j[None, :] < n_emit[:, None], length[:, None] + j, state.capacity)
    new_tokens = state.tokens.at[jnp.arange(B)[:, None], write_at].set(out_tokens, mode="drop")
    if K > 0:
        drafter_state = drafter.commit(drafter_state, ctx, K, n_acc, new_length)

    max_k = state.proposed_per_pos.shape[0]
    counted = jnp.arange(max_k) < K
    proposed = state.proposed_per_pos + jnp.where(counted, jnp.sum(active), 0)
    accepted = state.accepted_per_pos + jnp.where(
        counted, jnp.sum(active[:, None] & (n_acc[:, None] > jnp.arange(max_k)), 0), 0)

    new_state = state._replace(
        tokens=new_tokens,
        length=state.length.at[:B].set(new_length),
        active=state.active.at[:B].set(active & ~done),
        accepted_per_pos=accepted.astype(jnp.int32),
        proposed_per_pos=proposed.astype(jnp.int32),
        target_kv=target_kv,
        drafter=drafter_state,
    )
    return new_state, StepOutput(out_tokens, n_emit, n_acc, done, logprobs, raw_logprobs, top_logprobs,
                                 top_ids)


MAX_ROUNDS = 32  # rounds one dispatch may run (the `rounds` program's output depth)


def spec_rounds(target_graph, drafter: Drafter, opts: StepOptions, K: int, B: int, target_params,
                draft_params, state: DecodeState, num_rounds, any_active=jnp.any):
    """Up to `num_rounds` (<= MAX_ROUNDS, a runtime value) rounds of `spec_step` with the same
    K in one dispatch, stopping early once no row of the bucket is active.

    Returns (state, StepOutput stacked [MAX_ROUNDS, ...], rounds run). Rounds not run are
    zeros (nothing emitted). One round per dispatch is the usual case; the engine asks for
    more only while its controller's choice is stable, so the host's per-step work (and
    the device->host copy) is paid once per several rounds. `any_active` reduces the
    bucket's active flags (over every data shard, under data parallelism).
    """
    R, N = MAX_ROUNDS, opts.top_logprobs
    outs = StepOutput(jnp.zeros((R, B, K + 1), jnp.int32), jnp.zeros((R, B), jnp.int32),
                      jnp.zeros((R, B), jnp.int32), jnp.zeros((R, B), bool),
                      jnp.zeros((R, B, K + 1), jnp.float32), jnp.zeros((R, B, K + 1), jnp.float32),
                      jnp.zeros((R, B, K + 1, N), jnp.float32), jnp.zeros((R, B, K + 1, N), jnp.int32))

    def more(carry):
        i, state, _ = carry
        return (i < jnp.minimum(num_rounds, R)) & any_active(state.active[:B])

    def one_round(carry):
        i, state, outs = carry
        state, out = spec_step(target_graph, drafter, opts, K, B, target_params, draft_params,
                               state)
        return i + 1, state, jax.tree.map(lambda acc, x: acc.at[i].set(x), outs, out)

    rounds, state, outs = jax.lax.while_loop(more, one_round, (jnp.int32(0), state, outs))
    return state, outs, rounds


_PER_ROW = 5  # pack_rounds' last columns: n_emit, n_accepted, done, rounds run, N


def _bits(x) -> jax.Array:
    """float32 values as int32 bit patterns (packed with ints; the host views them back)."""
    return jax.lax.bitcast_convert_type(x, jnp.int32)


def pack_rounds(outs: StepOutput, rounds) -> jax.Array:
    """A dispatch's outputs as one int32 array [R, B, (3 + 2N) (K+1) + 5]: per round and row
    the tokens, logprobs and raw logprobs (bit patterns), the N top logprobs' ids and bits
    per position, then n_emit, n_accepted, done, the rounds run and N. The host reads one
    buffer back instead of nine (on XLA:CPU 0.3 ms less host CPU a dispatch, no wall-time
    difference measurable; on a GPU one device->host copy instead of nine)."""
    R, B, K1, N = outs.top_ids.shape
    per_row = jnp.stack([outs.n_emit, outs.n_accepted, outs.done.astype(jnp.int32),
                         jnp.broadcast_to(rounds, outs.n_emit.shape), jnp.full_like(outs.n_emit, N)],
                        axis=-1)
    return jnp.concatenate([outs.tokens, _bits(outs.logprobs), _bits(outs.raw_logprobs),
                            outs.top_ids.reshape(R, B, K1 * N), _bits(outs.top_logprobs).reshape(R, B, K1 * N),
                            per_row], axis=-1)


def unpack_rounds(packed: np.ndarray) -> tuple[StepOutput, int]:
    """`pack_rounds`'s inverse on the host: (StepOutput of numpy arrays [R, B, ...] for the
    rounds that ran, rounds run)."""
    ran, N = int(packed[0, 0, -2]), int(packed[0, 0, -1])
    K1 = (packed.shape[-1] - _PER_ROW) // (3 + 2 * N)
    packed = packed[:ran]
    cols = lambda i: packed[:, :, i * K1:(i + 1) * K1]
    top = lambda i: packed[:, :, (3 + i * N) * K1:(3 + (i + 1) * N) * K1].reshape(ran, packed.shape[1], K1, N)
    tail = packed[:, :, (3 + 2 * N) * K1:]
    return StepOutput(cols(0), tail[..., 0], tail[..., 1], tail[..., 2].astype(bool),
                      cols(1).view(np.float32), cols(2).view(np.float32), top(1).view(np.float32),
                      top(0)), ran


def prefill(target_graph, drafter: Drafter, opts: StepOptions, target_params, draft_params,
            state: DecodeState, rows, chunk, start, count, model_end, draft_end, next_tokens=None):
    """Writes a chunk of prompt tokens for N slots and runs target (and draft) over them.

    rows [N] slots; chunk [N, C] tokens at positions start[N] + 0..C-1, of which the
    first count[N] are real. The models process only positions < model_end[N] (the
    prompt minus its last, pending, token), the drafter (if it `catches_up_prompts`)
    only those < draft_end[N] as well: 0 leaves the row's prompt to its first round with
    K > 0, and a chunk no row takes does not run it. Rows with count 0 are padding.
    With next_tokens [N, C] (the prompt token after each position) it returns (state, the
    prompt logprobs packed by `pack_prompt_logprobs`) instead, which applies the LM head
    to a few positions at a time (`PROMPT_LOGITS_BYTES`).
    """
    C = chunk.shape[1]
    pos = start[:, None] + jnp.arange(C)
    real = jnp.arange(C)[None, :] < count[:, None]
    tokens = state.tokens.at[rows[:, None], jnp.where(real, pos, state.capacity)].set(chunk, mode="drop")
    model_pos = jnp.where(real & (pos < model_end[:, None]), pos, -1)
    # the logits are needed only to score the prompt, a few positions at a time
    hidden, target_kv, drafter_state = _target_forward(target_graph, drafter, opts, target_params, chunk,
                                                       model_pos, state.target_kv, state.drafter, rows,
                                                       head=False)
    params = drafter.bind_params(draft_params, target_graph, target_params)
    draft_pos = jnp.where(pos < draft_end[:, None], model_pos, -1)

    def run(s):
        return drafter.prefill(params, s, chunk, draft_pos, rows)

    # a chunk no row drafts skips a drafter that catches prompts up; any other runs, its rows
    # with draft_end 0 writing nothing (a taker of a kept completion, `prefix_sharing`)
    skippable = drafter.catches_up_prompts
    drafter_state = (jax.lax.cond(jnp.any(draft_pos >= 0), run, lambda s: s, drafter_state)
                     if skippable else run(drafter_state))
    state = state._replace(tokens=tokens, target_kv=target_kv, drafter=drafter_state)
    if next_tokens is None:
        return state
    head = lambda x: logits_of(target_graph, target_params, x)
    return state, pack_prompt_logprobs(head, hidden, next_tokens, opts.top_logprobs, PROMPT_LOGITS_BYTES)


# The most float32 logits a scored prefill holds at once: 256 MiB (a whole chunk's, 64 rows x
# 256 positions at Llama-3's vocabulary, would be 8 GiB). Read when the program is traced.
PROMPT_LOGITS_BYTES = 1 << 28


def logits_block(rows: int, positions: int, vocab: int, budget: int) -> int:
    """How many of a chunk's positions a scored prefill takes the logits of at once: the
    largest divisor of `positions` whose [rows, block, vocab] float32 logits fit `budget`
    (at least 1, whatever the budget)."""
    fits = [b for b in range(1, positions + 1)
            if positions % b == 0 and rows * b * vocab * 4 <= budget]
    return max(fits, default=1)


def pack_prompt_logprobs(head, hidden, next_tokens, top: int, budget: int) -> jax.Array:
    """A prefill chunk's prompt logprobs as int32 [N, C, 1 + 2 top]: per position the raw
    logprob of the next prompt token (bits; any value where there is none, next_tokens
    < 0), then its `top` likeliest ids and their raw logprobs (bits), largest first.

    head maps last-layer outputs [N, S, d] to float32 logits [N, S, V]; hidden is
    [N, C, d]. The logits of `logits_block` positions at a time are alive at once: a loop
    over blocks when the whole chunk's would not fit `budget`."""
    N, C = next_tokens.shape
    vocab = jax.eval_shape(head, jax.ShapeDtypeStruct((N, 1, hidden.shape[-1]), hidden.dtype)).shape[-1]

    def score(x, nxt):
        logits = head(x)
        parts = [_bits(sampling.token_logprobs(logits, jnp.maximum(nxt, 0)))[..., None]]
        if top:
            values, ids = sampling.top_logprobs(logits, top)
            parts += [ids, _bits(values)]
        return jnp.concatenate(parts, axis=-1)

    S = logits_block(N, C, vocab, budget)
    if S == C:
        return score(hidden, next_tokens)
    blocks = lambda a: jnp.moveaxis(a.reshape(N, C // S, S, *a.shape[2:]), 1, 0)  # [C/S, N, S, ...]
    packed = jax.lax.map(lambda xs: score(*xs), (blocks(hidden), blocks(next_tokens)))
    return jnp.moveaxis(packed, 0, 1).reshape(N, C, -1)


def unpack_prompt_logprobs(packed: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`pack_prompt_logprobs`'s inverse on the host: (own [..., C] float32, ids [..., C, top],
    values [..., C, top] float32)."""
    return (packed[..., 0].view(np.float32), packed[..., 1:1 + top],
            packed[..., 1 + top:].view(np.float32))


class SlotInit(NamedTuple):
    """Per-slot fields set when requests are admitted; arrays of N rows."""

    rows: jax.Array  # [N] int32, out of range (>= num_slots) for padding
    length: jax.Array
    limit: jax.Array
    min_length: jax.Array  # prompt length + min_tokens
    prompt_length: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    repetition_penalty: jax.Array
    presence_penalty: jax.Array
    frequency_penalty: jax.Array
    bias_ids: jax.Array  # [N, MAX_LOGIT_BIAS] (-1: unused)
    bias_values: jax.Array  # [N, MAX_LOGIT_BIAS]
    bad_words: jax.Array  # [N, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS] (-1: padding)
    allowed_ids: jax.Array  # [N, MAX_ALLOWED_TOKEN_IDS] (-1: unused)
    seed: jax.Array
    stop_ids: jax.Array  # [N, MAX_STOP_IDS]
    drafter_length: jax.Array  # the prompt length if the drafter was prefilled with it, else 1
    drafter: dict = {}  # the drafter's `admission_fields`: name -> [N, ...] (empty: none)


def admit(drafter: Drafter, state: DecodeState, init: SlotInit) -> DecodeState:
    def put(x, value):
        return x.at[init.rows].set(value, mode="drop")

    held = init.drafter_length  # what the drafter took in: the prompt, or (left to catch_up) nothing
    return state._replace(
        drafter=drafter.admit(state.drafter, init.rows, held, init.drafter)
        if init.drafter else drafter.admit(state.drafter, init.rows, held),
        length=put(state.length, init.length),
        limit=put(state.limit, init.limit),
        min_length=put(state.min_length, init.min_length),
        prompt_length=put(state.prompt_length, init.prompt_length),
        active=put(state.active, jnp.ones_like(init.length, bool)),
        temperature=put(state.temperature, init.temperature),
        top_k=put(state.top_k, init.top_k),
        top_p=put(state.top_p, init.top_p),
        min_p=put(state.min_p, init.min_p),
        repetition_penalty=put(state.repetition_penalty, init.repetition_penalty),
        presence_penalty=put(state.presence_penalty, init.presence_penalty),
        frequency_penalty=put(state.frequency_penalty, init.frequency_penalty),
        bias_ids=put(state.bias_ids, init.bias_ids),
        bias_values=put(state.bias_values, init.bias_values),
        bad_words=put(state.bad_words, init.bad_words),
        allowed_ids=put(state.allowed_ids, init.allowed_ids),
        seed=put(state.seed, init.seed),
        stop_ids=put(state.stop_ids, init.stop_ids),
    )


_PER_SLOT = ("tokens", "length", "limit", "min_length", "prompt_length", "active", "temperature",
             "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
             "bias_ids", "bias_values", "bad_words", "allowed_ids", "seed", "stop_ids")


def copy_slots(state: DecodeState, src, dst, count=None) -> DecodeState:
    """Copies slots src into slots dst (one row of every per-slot array, KV included);
    src, dst: scalars or [n] (a dst out of range is padding: nothing is written). Only the
    first `count` pairs are visited when it is given (padding after them costs nothing).

    One pair after another, in place: gathering every src row first held n rows of every
    layer's cache at once, at n = the slot count a second whole cache (20 GiB for 8B + 1B
    at 64 slots x 2048; GPU user audit)."""
    src, dst = jnp.atleast_1d(src), jnp.atleast_1d(dst)
    slots = state.length.shape[0]

    def one(i, st):
        to = jnp.clip(dst[i], 0, slots - 1)
        # padding copies the destination row onto itself
        frm = jnp.where((dst[i] >= 0) & (dst[i] < slots), jnp.clip(src[i], 0, slots - 1), to)

        def cp(x):
            return jax.lax.dynamic_update_index_in_dim(x, jax.lax.dynamic_index_in_dim(x, frm, 0), to, 0)

        return st._replace(**{f: cp(getattr(st, f)) for f in _PER_SLOT},
                           target_kv=jax.tree.map(cp, st.target_kv), drafter=jax.tree.map(cp, st.drafter))

    return jax.lax.fori_loop(0, src.shape[0] if count is None else count, one, state)


def per_slot(state) -> tuple:
    """The state's per-slot leaves: (the `_PER_SLOT` fields, target KV, drafter state). Of a
    `DecodeState` of arrays, or of its specs or shardings."""
    return tuple(getattr(state, f) for f in _PER_SLOT), state.target_kv, state.drafter


def slot_rows(state: DecodeState, slots) -> tuple:
    """Rows `slots` ([m], or a scalar: m = 1) of every per-slot array (`per_slot`, the
    slot axis of length m); an out-of-range slot reads the last one."""
    slots = jnp.clip(jnp.atleast_1d(slots), 0, state.length.shape[0] - 1)
    return jax.tree.map(lambda x: x[slots], per_slot(state))


def move_slots(state: DecodeState, src, dst, dst_rows) -> DecodeState:
    """Swaps slots src[i] and dst[i] and frees src[i], for i in order, as one swap after
    another would: copies each src into its dst, then writes `dst_rows`
    (`slot_rows(state, dst)`, read by a program of its own before this one) into the srcs.
    Keeps live requests packed in slots 0..n-1 while a finished request's slot, prompt and
    completion, stays in a free slot for a later prompt that begins with them
    (`dsd_jax.prefix_sharing`). src, dst: [m] (or scalars). A dst out of range frees src
    and moves nothing (a freed slot that stays where it is); a src out of range is padding,
    which comes after the pairs and costs nothing.

    Reading the dsts first and writing the srcs last equals the swaps in turn only for
    pairs `swap_batches` lets share a call: no slot is a dst twice or a src twice, and no
    src is a later pair's dst (a src may be an earlier pair's dst: a chain).

    Two programs, because one swapping both rows made XLA copy every per-slot array whole
    (72 ms against 3.0 ms for a one-slot copy on the built-in pair's state; 6.0 ms so, twice
    a copy's bytes at its bandwidth: `benchmarks/results/prefix_sharing/swap_cost.py`)."""
    slots = state.length.shape[0]
    src, dst = jnp.atleast_1d(src), jnp.atleast_1d(dst)
    count = jnp.sum((src >= 0) & (src < slots))
    moved = copy_slots(state, src, dst, count)

    def put(i, st):  # dst's old rows into src; a pair without a swap writes src's own row back
        at = jnp.clip(src[i], 0, slots - 1)
        swap = (dst[i] >= 0) & (dst[i] < slots)

        def one(x, rows):
            row = jnp.where(swap, jax.lax.dynamic_index_in_dim(rows, i, 0), jax.lax.dynamic_index_in_dim(x, at, 0))
            return jax.lax.dynamic_update_index_in_dim(x, row, at, 0)

        fields, kv, drafter = jax.tree.map(one, per_slot(st), dst_rows)
        return st._replace(**dict(zip(_PER_SLOT, fields)), target_kv=kv, drafter=drafter)

    moved = jax.lax.fori_loop(0, count, put, moved)
    return moved._replace(active=moved.active.at[src].set(False, mode="drop"))


def swap_batches(pairs, per_call: int, slots: int) -> list[list[tuple[int, int]]]:
    """`pairs` ((src, dst) swaps, in order) cut into consecutive runs of at most `per_call`
    that `move_slots` may do in one call: a run ends before a pair whose src is a src of
    the run, or whose dst is a src or dst of it (a dst out of range, no swap, is never a
    dst). In turn, the runs equal the swaps one by one."""
    runs, srcs, dsts = [], set(), set()
    for src, dst in pairs:
        if not runs or len(runs[-1]) == per_call or src in srcs or dst in srcs or dst in dsts:
            runs.append([])
            srcs, dsts = set(), set()
        runs[-1].append((src, dst))
        srcs.add(src)
        if 0 <= dst < slots:
            dsts.add(dst)
    return runs
