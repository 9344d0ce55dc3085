"""Sampling: per-row temperature -> min-p -> top-k -> top-p -> softmax, shared by every
path (before them: allowed_token_ids, stop ids banned before min_tokens, `dsd_jax.bad_words`,
logit_bias, and `dsd_jax.penalties`).

Plain and speculative decoding both build their distributions here; a different
order in one path would silently break losslessness. Temperature 0 means greedy:
the distribution is the one-hot of the argmax of the raw logits.

Random numbers are derived per (request seed, absolute position, stream), never
from a global step key, so a request's tokens do not depend on which other
requests share its batch, and drafter-invariant decoding can reuse the exact noise
plain decoding used at the same position.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dsd_jax.stop_strings import stop_list

# Noise streams per (seed, position).
STREAM_TARGET = 0  # Gumbel noise for the target's token (plain sampling, drafter-invariant mode)
STREAM_DRAFT = 1  # Gumbel noise for a draft proposal sampled from q
STREAM_ACCEPT = 2  # uniform for the accept test
STREAM_RESIDUAL = 3  # Gumbel noise for the recovered token

GREEDY_BELOW = 1e-5  # temperatures below this sample greedily (`SamplingParams`)
MAX_LOGIT_BIAS = 300  # entries of one request's logit_bias (the device keeps [slots, 300])
MAX_ALLOWED_TOKEN_IDS = 4096  # ids of one request's allowed_token_ids (the device keeps [slots, 4096])


def is_integer(x) -> bool:
    """A Python, numpy or 0-d JAX integer. bool is not: True is no token id or count."""
    if isinstance(x, bool):
        return False
    if isinstance(x, numbers.Integral):  # int and the numpy integer scalars
        return True
    return _zero_dim_kind(x) in ("i", "u")  # a 0-d numpy or JAX array


def _zero_dim_kind(x) -> str | None:
    """The dtype kind of a 0-d array ("i", "u", "f", ...), else None."""
    if getattr(x, "ndim", None) != 0:
        return None
    return getattr(getattr(x, "dtype", None), "kind", None)


def _integer(name: str, value, low: int, high: int | None = None) -> int:
    """value as an int in [low, high]; a float, string or bool is refused, not truncated."""
    if not is_integer(value):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _real(name: str, value) -> float:
    """value as a float (any Python, numpy or 0-d JAX number but a bool)."""
    number = isinstance(value, numbers.Real) or _zero_dim_kind(value) in ("i", "u", "f")
    if isinstance(value, bool) or not number:
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def distinct_token_ids(value, name: str = "stop_token_ids") -> tuple[int, ...]:
    """Stop ids as a tuple of distinct non-negative ints, in first-occurrence order: a
    sequence or 1-D array of integers, one integer, or None (none). Repeats are dropped, so
    they do not count against the engine's limit (`state.MAX_STOP_IDS`)."""
    if value is None:
        return ()
    if is_integer(value):
        value = (value,)
    if (isinstance(value, (str, bytes)) or getattr(value, "ndim", 1) == 0
            or not isinstance(value, collections.abc.Iterable)):
        raise ValueError(f"{name} must be a sequence of token ids, got {value!r}")
    ids = (_integer(f"{name}[{j}]", t, 0) for j, t in enumerate(value))
    return tuple(dict.fromkeys(ids))  # every element checked; repeats dropped, order kept


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (vLLM names).

    temperature 0 is greedy, and so is one below `GREEDY_BELOW` (1e-5, as vLLM: logits / T
    would overflow float32; the distribution is one-hot there but for near-ties); top_k 0
    (or vLLM's -1), top_p 1.0 and min_p 0.0 disable those filters (a top_k at or above the
    vocabulary size keeps every token, as 0 does). In vLLM's order: min-p keeps the tokens
    at least min_p times as likely as the likeliest (after temperature), top-k then keeps
    every token tied with the k-th, and top-p applies to what top-k kept.
    Greedy ignores the filters: they are reset to off (as vLLM), so a greedy row's
    logprobs are the full distribution's whatever top_k, top_p or min_p it was given.
    `seed` fixes the request's noise (an integer in [0, 2**32); None or vLLM's -1: the
    engine assigns one).
    `stop_token_ids`: token ids that end the completion (a sequence, or one id; a repeated
    id is kept once, at its first place: at most `state.MAX_STOP_IDS` (8) distinct ids).
    `include_stop_token`: whether a matched stop id is part of the returned tokens.
    `stop` (vLLM's name): strings that end the completion, matched in its decoded text (the
    engine needs a tokenizer; `dsd_jax.stop_strings`): its token ids end with the token
    that completed the string, its text before the string, or after it with
    `include_stop_str_in_output`.
    `min_tokens` (vLLM's name): the completion's first min_tokens tokens are never its stop
    ids (nor the engine's end-of-text ids): those get probability 0 there, before
    temperature and the filters, in the target's distribution and the drafter's alike (so
    the output is an exact sample of that law), and a stop string must end after them.
    At most `max_tokens`; a slot too short for it still ends at max_seq_len ("length").
    `max_tokens` None (vLLM's): as many as the slot holds after the prompt.
    `ignore_eos` (vLLM's name): leave out the engine's end-of-text ids
    (`SpecEngine.eos_token_ids`, by default its tokenizer's), which otherwise end the
    completion as stop ids do; `stop_token_ids` still apply.
    `repetition_penalty` (1: off, > 0), `presence_penalty` and `frequency_penalty` (0: off,
    in [-2, 2]), vLLM's and the OpenAI API's: on the raw logits, before temperature and
    the filters, a token seen in the prompt or the completion has a positive logit divided
    by the repetition penalty and a negative one multiplied by it, and a token in the
    completion loses presence_penalty once and frequency_penalty per occurrence
    (`dsd_jax.penalties`). A greedy row takes the argmax of the penalised logits.
    `logit_bias` (vLLM's and OpenAI's): {token id: bias in [-100, 100]}, added to the raw
    logits before the penalties (at most `MAX_LOGIT_BIAS`, 300, entries; -100 all but bans
    a token, as OpenAI says).
    `bad_words` (vLLM's): words the completion may not contain. Each is tokenized as
    written and with a leading space (`dsd_jax.bad_words`, vLLM's rule; the engine needs a
    tokenizer); a sequence's last token gets probability 0 wherever the completion's
    preceding tokens are the rest of it (the prompt does not count), in the target's law
    and the drafter's alike. At most `bad_words.MAX_BAD_WORDS` (64) token sequences of
    `MAX_BAD_WORD_TOKENS` (16) tokens.
    `allowed_token_ids` (vLLM's): the only ids the completion may hold (every other gets
    probability 0, before everything else); None: every id. Distinct, non-empty, at most
    `MAX_ALLOWED_TOKEN_IDS` (4096), inside the vocabulary (checked by the engine).
    `n`: completions of the prompt (group sampling, as GRPO draws G per prompt). The
    prompt is prefilled once per admission (siblings admitted later, when the group has
    more completions than free slots, share it as any prompt does: `share_prefixes`, 32
    tokens or more); completion g draws from seed `seed + g`, or from an
    engine-assigned seed of its own. With a seed, completion g equals a single request
    with seed `seed + g` under `SpecConfig(acceptance="drafter_invariant")` (every output
    is token-identical to plain sampling with its seed). Under the default "rejection"
    acceptance the tokens also depend on the drafts, so they are equal only when the
    drafter reads each row alone ("draft_model", "eagle3", "ngram") and K does not depend
    on the batch (a static K); with method "suffix" siblings draft for each other and a
    member's tokens differ from the single request's (each is still an exact sample).
    With method "suffix" under "rejection", a request given references (or a
    `RolloutMemory`) draws its noise from the seed mixed with them (their tokens and the
    seed each was drawn from, `RequestOutput.noise_seed`; pass outputs themselves as
    references, or the engine mixes in its call number, fresh within one engine but not
    across engines re-created with the same seed): a reference drawn with the same
    seed came from the same noise, and a draft copied from it would bias acceptance. Same
    seed and same references (outputs) give the same output.
    `logprobs` (vLLM's): also return, for each completion token, the log probabilities of
    the `logprobs` most likely tokens at its position, and of the chosen one
    (`RequestOutput.top_logprobs`); None: none. They are vLLM's default kind, log_softmax of
    the raw target logits (`RequestOutput.raw_logprobs`'s distribution). At most the
    engine's `max_logprobs` (`SpecEngine(max_logprobs=...)`, 0 by default: the top-N costs
    every step a top-k over the vocabulary and a wider output, so an engine pays it only
    when built for it).
    `prompt_logprobs` (vLLM's): the same for the prompt's tokens (`RequestOutput.prompt_logprobs`:
    None for the first token, which nothing predicts, then per token the `prompt_logprobs`
    likeliest at its position and its own); None: none. At most the engine's `max_logprobs`;
    0 (the token's own logprob) on any engine. The prefill then keeps the target's logits at
    every prompt position (a chunk's [rows, chunk, vocabulary] of scratch) and reads them
    back, in programs of their own: only admissions with such a request run them.

    Every field is checked and normalised here (ints, floats, a tuple of ints): a float
    where an integer belongs (n=2.0, seed=2.5, a stop id 1.9) is refused, not truncated.
    What depends on the model (stop ids inside the vocabulary, seed + n - 1 < 2**32) is
    checked by the engine when a call is made, before anything runs.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: Sequence[int] = ()
    seed: int | None = None
    include_stop_token: bool = True
    n: int = 1
    ignore_eos: bool = False
    stop: Sequence[str] = ()
    include_stop_str_in_output: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None
    bad_words: Sequence[str] = ()
    allowed_token_ids: Sequence[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self):
        def set_(name, value):  # frozen: normalised values are written once, here
            object.__setattr__(self, name, value)

        set_("n", _integer("n (completions per prompt)", self.n, 1))
        set_("temperature", _real("temperature", self.temperature))
        if not 0.0 <= self.temperature < float("inf"):  # also NaN
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature < GREEDY_BELOW:  # logits / T would overflow float32 to inf
            set_("temperature", 0.0)
        set_("top_k", max(0, _integer("top_k (0 or -1 = off)", self.top_k, -1)))  # -1: vLLM's off
        set_("top_p", _real("top_p", self.top_p))
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        set_("min_p", _real("min_p", self.min_p))
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.temperature == 0.0:  # vLLM's: greedy takes the argmax of the whole distribution
            for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)):
                set_(name, off)
        if self.max_tokens is not None:  # None: what the slot holds (the engine's budget)
            set_("max_tokens", _integer("max_tokens", self.max_tokens, 1))
        set_("min_tokens", _integer("min_tokens", self.min_tokens, 0))
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_tokens "
                             f"({self.max_tokens})")
        set_("repetition_penalty", _real("repetition_penalty", self.repetition_penalty))
        if not 0.0 < self.repetition_penalty < float("inf"):  # also NaN
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1: off), got "
                             f"{self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            set_(name, _real(name, getattr(self, name)))
            if not -2.0 <= getattr(self, name) <= 2.0:  # vLLM's and OpenAI's range; also NaN
                raise ValueError(f"{name} must be in [-2, 2] (0: off), got {getattr(self, name)}")
        set_("logit_bias", _logit_bias(self.logit_bias))
        set_("stop_token_ids", distinct_token_ids(self.stop_token_ids))
        set_("stop", stop_list(self.stop))
        set_("bad_words", stop_list(self.bad_words, "bad_words", blank_too=True,
                                    why="a bad word must have a token to ban"))
        set_("allowed_token_ids", _allowed_token_ids(self.allowed_token_ids))
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                set_(name, _integer(f"{name} (top log probabilities per token)", getattr(self, name), 0))
        if is_integer(self.seed) and int(self.seed) == -1:
            set_("seed", None)  # vLLM's "no seed"
        if self.seed is not None:  # the device keeps seeds as uint32: refuse, do not wrap
            set_("seed", _integer("seed", self.seed, 0, 2 ** 32 - 1))
        for name in ("include_stop_token", "ignore_eos", "include_stop_str_in_output"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):  # "False" would be true
                raise ValueError(f"{name} must be a bool, got {value!r}")
            set_(name, bool(value))


def _logit_bias(value) -> dict[int, float] | None:
    """logit_bias as a new {int id: float bias} dict ordered by id; None or {}: None."""
    if value is None:
        return None
    if not isinstance(value, collections.abc.Mapping):
        raise ValueError(f"logit_bias must be a mapping of token id to bias, got {value!r}")
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias has {len(value)} entries; at most {MAX_LOGIT_BIAS} are supported")
    out = {}
    for t, bias in value.items():
        t, bias = _integer("logit_bias token id", t, 0), _real(f"logit_bias[{t}]", bias)
        if not -100.0 <= bias <= 100.0:  # OpenAI's range; also NaN
            raise ValueError(f"logit_bias[{t}] must be in [-100, 100], got {bias}")
        out[t] = bias
    return dict(sorted(out.items())) or None


def _allowed_token_ids(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    ids = distinct_token_ids(value, "allowed_token_ids")
    if not ids:
        raise ValueError("allowed_token_ids is empty: no token could be drawn (None allows every token)")
    if len(ids) > MAX_ALLOWED_TOKEN_IDS:
        raise ValueError(f"allowed_token_ids has {len(ids)} distinct ids; at most {MAX_ALLOWED_TOKEN_IDS} "
                         "are supported")
    return ids


def allowed_array(allowed_token_ids) -> np.ndarray:
    """A request's allowed_token_ids as the device's row [MAX_ALLOWED_TOKEN_IDS] int32,
    packed from column 0 (`lists_any`; -1: unused; all -1: every id allowed)."""
    out = np.full(MAX_ALLOWED_TOKEN_IDS, -1, np.int32)
    out[:len(allowed_token_ids or ())] = allowed_token_ids or ()
    return out


def allowed_logits(logits, allowed_ids, active):
    """float32 logits [B, ..., V] with every id outside each row's allowed_token_ids at
    -inf (allowed_ids [B, M], -1: unused; a row with none allows every id), or unchanged
    when no live row has a list (the dense mask is not built)."""
    logits = logits.astype(jnp.float32)

    def mask(x):
        B, V = x.shape[0], x.shape[-1]
        ids = jnp.where(allowed_ids >= 0, allowed_ids, V)  # V: out of range, dropped
        keep = jnp.zeros((B, V), bool).at[jnp.arange(B)[:, None], ids].set(True, mode="drop")
        keep |= ~lists_any(allowed_ids)[:, None]
        return jnp.where(keep.reshape((B,) + (1,) * (x.ndim - 2) + (V,)), x, -jnp.inf)

    return jax.lax.cond(any_listed(allowed_ids, active), mask, lambda x: x, logits)


def bias_arrays(logit_bias: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """A request's logit_bias as the device's rows: ids [MAX_LOGIT_BIAS] int32, packed from
    column 0 (`lists_any`; -1: unused), and biases [MAX_LOGIT_BIAS] float32."""
    ids = np.full(MAX_LOGIT_BIAS, -1, np.int32)
    biases = np.zeros(MAX_LOGIT_BIAS, np.float32)
    if logit_bias:
        ids[:len(logit_bias)] = list(logit_bias)
        biases[:len(logit_bias)] = list(logit_bias.values())
    return ids, biases


def biased_logits(logits, bias_ids, bias_values, active):
    """float32 logits [B, ..., V] plus each row's logit_bias (ids, values [B, M]; -1: none),
    or the logits unchanged when no live row has one (the dense bias is not built)."""
    logits = logits.astype(jnp.float32)

    def add(x):
        B, V = x.shape[0], x.shape[-1]
        ids = jnp.where(bias_ids >= 0, bias_ids, V)  # V: out of range, dropped
        dense = jnp.zeros((B, V), jnp.float32).at[jnp.arange(B)[:, None], ids].add(bias_values, mode="drop")
        return x + dense.reshape((B,) + (1,) * (x.ndim - 2) + (V,))

    return jax.lax.cond(any_listed(bias_ids, active), add, lambda x: x, logits)


def lists_any(ids):
    """Whether each row lists an id (ids [B, M]: logit_bias or allowed_token_ids rows,
    packed from column 0, -1: unused) -> [B]. Column 0 alone, because these checks run
    every round: scanning all 4096 allowed ids of every row made a 64-row round of a
    small model 1.3x as long on CPU (ngram drafts; 1.1x with suffix drafts)."""
    return ids[:, 0] >= 0


def any_listed(ids, active):
    """Whether a live row lists an id (`lists_any`): a scalar."""
    return jnp.any(active & lists_any(ids))


def _expand(param, logits):
    """Broadcasts a per-row [B] parameter against logits [B, ..., V]."""
    param = jnp.asarray(param)
    return param.reshape(param.shape + (1,) * (logits.ndim - param.ndim))


def filter_logits(logits, top_k, top_p, min_p=None):
    """Min-p, top-k, then top-p on (temperature-scaled) logits; filtered entries become
    -inf. min_p None: 0 for every row.

    Ties at a threshold are all kept, identically in every path. The vocabulary sort
    is skipped when no row filters (it would dominate a small model's step).
    """
    min_p = jnp.zeros(jnp.shape(top_p), jnp.float32) if min_p is None else min_p
    needed = (jnp.any(jnp.asarray(top_k) > 0) | jnp.any(jnp.asarray(top_p) < 1.0)
              | jnp.any(jnp.asarray(min_p) > 0.0))
    return jax.lax.cond(needed, _filter_logits, lambda x, *_: x, logits, top_k, top_p, min_p)


def _filter_logits(logits, top_k, top_p, min_p):
    V = logits.shape[-1]
    top_k, top_p, min_p = _expand(top_k, logits), _expand(top_p, logits), _expand(min_p, logits)
    neg_inf = jnp.float32(-jnp.inf)
    # min-p: p >= min_p * p_max is logit >= max logit + log(min_p) (log 0 = -inf keeps all)
    floor = jnp.max(logits, axis=-1, keepdims=True) + jnp.log(min_p)
    logits = jnp.where(logits < floor, neg_inf, logits)
    sorted_desc = -jnp.sort(-logits, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
    kth = jnp.take_along_axis(sorted_desc, k - 1, axis=-1)
    logits = jnp.where(logits < kth, neg_inf, logits)

    # top-p over what top-k kept, ties at the k-th value included (as vLLM): normalising over
    # only the first k sorted entries would inflate every probability and keep too few
    in_k = sorted_desc >= kth
    probs = jax.nn.softmax(jnp.where(in_k, sorted_desc, neg_inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = (mass_before < top_p) | (top_p >= 1.0)
    n_keep = jnp.maximum(jnp.sum(keep & in_k, axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(sorted_desc, n_keep - 1, axis=-1)
    return jnp.where(logits < threshold, neg_inf, logits)


def banned_ids(stop_ids, positions, min_length):
    """The ids a row may not draw at each position (`SamplingParams.min_tokens`), [B, T, S]
    (-1: none): its stop ids, end-of-text ids included, at positions below its min_length
    (prompt length + min_tokens). stop_ids [B, S] (-1: unused), positions [B, T]."""
    early = positions < min_length[:, None]
    return jnp.where(early[..., None], stop_ids[:, None, :], -1)


def suppress(logits, banned):
    """logits [..., V] with each position's `banned` ids [..., S] (-1: none) at -inf."""
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    ids = jnp.where(banned >= 0, banned, V).reshape(flat.shape[0], -1)  # V: out of range, dropped
    rows = jnp.arange(flat.shape[0])[:, None]
    return flat.at[rows, ids].set(-jnp.inf, mode="drop").reshape(logits.shape)


def processed_logits(logits, temperature, top_k, top_p, banned=None, min_p=None):
    """Temperature-scaled, filtered float32 logits: log of the sampling distribution
    up to a constant. Greedy rows (temperature 0) keep their raw logits. `banned`
    (`banned_ids`, [..., S]; None: none) are set to -inf first, as vLLM's min_tokens
    processor runs before temperature and the filters (top-k counts only what is left);
    min_p: per row, None: 0 (off)."""
    logits = logits.astype(jnp.float32)
    t = _expand(temperature, logits)
    scaled = logits / jnp.where(t > 0, t, 1.0)  # a fresh buffer: the ban writes into it in place
    if banned is not None:  # -inf / t is -inf: banning after scaling is banning before it
        scaled = suppress(scaled, banned)
    return filter_logits(scaled, top_k, top_p, min_p)


def plain_greedy(active, temperature, top_k, top_p, min_p=None):
    """Whether every live row is greedy and unfiltered (a scalar): then, unless a row also
    adjusts its logits (bans, lists, biases, penalties: the callers check those), the
    sampling distribution is the one-hot argmax of the raw logits and the processed
    logprobs are the raw ones, so the steps may skip processing, noise and sampling."""
    sampled_or_filtered = (temperature > 0) | (top_k > 0) | (top_p < 1.0)
    if min_p is not None:
        sampled_or_filtered |= min_p > 0.0
    return ~jnp.any(active & sampled_or_filtered)


def bans_any(active, banned):
    """Whether a live row bans an id (`banned_ids`, [B, T, S] or [B, S]; a scalar)."""
    return jnp.any(active & jnp.any((banned >= 0).reshape(banned.shape[0], -1), axis=-1))


def _shifted_logits(logits):
    """(logits - their max, log of the sum of exp of that) over the vocabulary, [..., V] and
    [..., 1]: log_softmax is their difference, in `jax.nn.log_softmax`'s arithmetic."""
    logits = logits.astype(jnp.float32)
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    return shifted, jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))


def token_logprobs(logits, tokens):
    """log_softmax(logits)[tokens] without the full-vocabulary result (the same arithmetic
    as `jax.nn.log_softmax`, so the same bits). logits [..., V], tokens [...]."""
    shifted, log_total = _shifted_logits(logits)
    return jnp.take_along_axis(shifted, tokens[..., None], axis=-1)[..., 0] - log_total[..., 0]


def top_logprobs(logits, n: int):
    """The n largest entries of log_softmax(logits) and their ids, largest first: (values
    float32 [..., n], ids int32 [..., n]), the arithmetic of `token_logprobs`."""
    shifted, log_total = _shifted_logits(logits)
    values, ids = jax.lax.top_k(shifted, n)
    return values - log_total, ids.astype(jnp.int32)


def sampling_probs(logits, temperature, top_k, top_p, banned=None, min_p=None):
    """The distribution tokens are drawn from: one-hot argmax for greedy rows."""
    return probs_from_processed(processed_logits(logits, temperature, top_k, top_p, banned, min_p),
                                temperature)


def probs_from_processed(processed, temperature):
    """`sampling_probs` from already processed logits (argmax is unchanged by processing)."""
    greedy = _expand(temperature, processed) <= 0
    probs = jax.nn.softmax(processed, axis=-1)
    one_hot = jax.nn.one_hot(jnp.argmax(processed, axis=-1), processed.shape[-1], dtype=probs.dtype)
    return jnp.where(greedy, one_hot, probs)


def position_keys(seeds, positions, stream: int):
    """One PRNG key per (seed, position) for a noise stream. seeds: [B]; positions: [B, T]."""
    def key(seed, pos):
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), pos), stream)
    return jax.vmap(jax.vmap(key, in_axes=(None, 0)))(seeds, positions)


def gumbel_noise(seeds, positions, stream: int, vocab: int):
    """Gumbel noise [B, T, V] for each (seed, position)."""
    keys = position_keys(seeds, positions, stream)
    return jax.vmap(jax.vmap(lambda k: jax.random.gumbel(k, (vocab,), jnp.float32)))(keys)


def uniform_noise(seeds, positions, stream: int):
    """Uniforms [B, T] in [0, 1) for each (seed, position)."""
    keys = position_keys(seeds, positions, stream)
    return jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32)))(keys)


def noise_if_sampling(temperature, make):
    """`make()` unless every row is greedy, where noise is ignored: then zeros, skipping
    the random-number generation (a large share of a small model's step)."""
    shape = jax.eval_shape(make)
    return jax.lax.cond(jnp.any(temperature > 0), make, lambda: jnp.zeros(shape.shape, shape.dtype))


def gumbel_argmax(logits, noise, temperature):
    """Gumbel-max sampling; greedy rows ignore the noise. logits are processed logits."""
    greedy = _expand(temperature, logits)[..., 0] <= 0
    sampled = jnp.argmax(logits + noise, axis=-1)
    return jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)


def sample(logits, temperature, top_k, top_p, noise):
    """Draws one token per row from the sampling distribution with Gumbel noise."""
    return gumbel_argmax(processed_logits(logits, temperature, top_k, top_p), noise, temperature)
