"""A completion's text as vLLM gives it (`RequestOutput.text`, and the text stop strings
are matched in).

- **After the prompt.** A completion is decoded with the prompt's last `CONTEXT_TOKENS`
  before it, and the text those give is taken off: a SentencePiece tokenizer (Llama-2,
  Mistral) drops a sequence's leading space, so decoded alone a completion lost the space
  its first token carries (and a stop string starting with it never matched). vLLM
  primes its detokenizer with the prompt.
- **Special tokens skipped** (vLLM's `skip_special_tokens=True`): a `tokenizers.Tokenizer`
  skips them by default, a transformers tokenizer keeps them unless told.
- **A stop id's own text left out** unless `include_stop_str_in_output`, as vLLM's
  detokenizer leaves out the token that ended a row (the token ids keep it:
  `include_stop_token`).
"""

from __future__ import annotations

from typing import Callable, Sequence

# What a byte-level tokenizer decodes an incomplete UTF-8 sequence to.
INCOMPLETE = "\ufffd"
# Tokens decoded before new ones (vLLM's incremental detokenizing): a tokenizer may decode
# a sequence's first token differently (a leading space dropped), and a character's bytes
# may be split between tokens; a few tokens of context make the new text read as it does
# in the whole text.
CONTEXT_TOKENS = 6

Decode = Callable[[list[int]], str]


def decoder(tokenizer) -> Decode:
    """The tokenizer's decode, special tokens skipped (a tokenizer without that switch: its
    own decode). Which of the two is found at the first call, so a tokenizer that only
    encodes (token-id outputs need no text) is no error until text is asked for."""
    skip: bool | None = None

    def decode(ids: list[int]) -> str:
        nonlocal skip
        if skip is None:
            try:
                tokenizer.decode([], skip_special_tokens=True)
                skip = True
            except TypeError:
                skip = False
        return tokenizer.decode(ids, skip_special_tokens=True) if skip else tokenizer.decode(ids)
    return decode


def text_after(decode: Decode, context: Sequence[int], tokens: Sequence[int]) -> str:
    """The text `tokens` add after `context` (the token ids before them)."""
    if not len(context):
        return decode(list(tokens))
    before = decode(list(context))
    return decode(list(context) + list(tokens))[len(before):]


def completion_text(decode: Decode, prompt: Sequence[int], tokens: Sequence[int],
                    stop_token_last: bool, include_stop_str: bool) -> str:
    """A completion's text: `tokens` after the prompt's last tokens, the last token's text
    left out when it is a stop id that ended the row (`stop_token_last`) and the request
    does not include stop strings in its output."""
    if stop_token_last and not include_stop_str:
        tokens = tokens[:-1]
    return text_after(decode, prompt[-CONTEXT_TOKENS:], tokens)
