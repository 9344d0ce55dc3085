"""vLLM's `bad_words`: token sequences a completion may not produce.

As vLLM defines them: each bad word is tokenized as written (leading spaces stripped) and
again with one leading space (a word in mid-text), and the second kept only when it
differs from the first in its first token and has as many tokens. A sequence's last
token gets probability 0 at a position whose preceding completion tokens are the rest
of it (a one-token word: everywhere); the prompt never counts.

On the device each slot holds its sequences right-aligned in a [MAX_BAD_WORDS,
MAX_BAD_WORD_TOKENS] array (-1: padding), so the last token of every sequence sits in
the last column. A round bans, at each window position, the last tokens of the
sequences whose prefix ends the completion so far (its committed tokens plus the drafts
before that position), recomputed from the token buffer every round: nothing per slot
follows acceptance or moves. The bans join min_tokens' (`sampling.banned_ids`), so every
path suppresses them alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MAX_BAD_WORDS = 64  # token sequences per request (each word gives one or two; vLLM: 128)
MAX_BAD_WORD_TOKENS = 16  # tokens per sequence
NOT_COMPLETION = -2  # a history slot before the completion: matches no token id (nor padding)


def token_sequences(words, tokenizer, vocab: int) -> list[tuple[int, ...]]:
    """vLLM's tokenization of bad words (each as written, without leading spaces; again
    with one leading space where that gives as many tokens and another first one),
    distinct, in order. Refuses, naming the word, what the device cannot hold or could
    never match."""
    def encode(text):
        enc = tokenizer.encode(text, add_special_tokens=False)
        return tuple(int(t) for t in (enc.ids if hasattr(enc, "ids") else enc))

    out: list[tuple[int, ...]] = []
    for word in words:
        plain, spaced = encode(word.lstrip()), encode(" " + word.lstrip())
        if not plain:
            raise ValueError(f"bad word {word!r} tokenizes to no tokens")
        for seq in [plain] + ([spaced] if spaced and spaced[0] != plain[0] and len(spaced) == len(plain)
                              else []):
            if len(seq) > MAX_BAD_WORD_TOKENS:
                raise ValueError(f"bad word {word!r} tokenizes to {len(seq)} tokens; at most "
                                 f"{MAX_BAD_WORD_TOKENS} are supported")
            if max(seq) >= vocab:
                raise ValueError(f"bad word {word!r} tokenizes to id {max(seq)}, outside the vocabulary "
                                 f"[0, {vocab})")
            out.append(seq)
    out = list(dict.fromkeys(out))
    if len(out) > MAX_BAD_WORDS:
        raise ValueError(f"bad_words tokenize to {len(out)} token sequences (a word can give two); at "
                         f"most {MAX_BAD_WORDS} are supported")
    return out


def rows(sequences) -> np.ndarray:
    """A request's sequences as its device row [MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS] int32,
    right-aligned, -1 padding."""
    out = np.full((MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, np.int32)
    for i, seq in enumerate(sequences):
        out[i, MAX_BAD_WORD_TOKENS - len(seq):] = seq
    return out


def bans(bad, tokens, prompt_length, length, drafts, before):
    """The ids each position bans, [B, T, MAX_BAD_WORDS] (-1: none).

    bad [B, W, L]: each row's sequences (`rows`); tokens [B, C] committed up to length
    [B], the prompt up to prompt_length [B]; drafts [B, J]: the round's proposals so far;
    before [B, T]: how many of them precede each position (the window: 0..K; a drafter's
    next proposal: the ones it made)."""
    width = bad.shape[-1] - 1  # a prefix's length at most
    at = length[:, None] - width + jnp.arange(width)  # the last `width` committed positions
    tail = jnp.take_along_axis(tokens, jnp.clip(at, 0, tokens.shape[1] - 1), axis=1)
    tail = jnp.where(at >= prompt_length[:, None], tail, NOT_COMPLETION)
    history = jnp.concatenate([tail, drafts], axis=1)  # [B, width + J]
    window = before[:, :, None] + jnp.arange(width)  # the `width` tokens before each position
    recent = jnp.take_along_axis(history[:, None, :], window, axis=2)  # [B, T, width]
    prefix, last = bad[:, None, :, :-1], bad[:, None, :, -1]  # [B, 1, W, width], [B, 1, W]
    matches = jnp.all((prefix == -1) | (prefix == recent[:, :, None, :]), axis=-1)
    return jnp.where(matches & (last >= 0), last, -1)


def any_bad(bad, active) -> jax.Array:
    """Whether a live row has a bad word (a scalar)."""
    return jnp.any(active & jnp.any(bad[:, :, -1] >= 0, axis=-1))


def banned_by_bad_words(bad, active, tokens, prompt_length, length, drafts, before):
    """`bans`, or no bans (-1) without computing them when no live row has a bad word."""
    B, T, W = before.shape[0], before.shape[1], bad.shape[1]
    return jax.lax.cond(any_bad(bad, active),
                        lambda: bans(bad, tokens, prompt_length, length, drafts, before),
                        lambda: jnp.full((B, T, W), -1, jnp.int32))
