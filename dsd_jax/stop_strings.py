"""Stop strings (vLLM's `SamplingParams.stop`), matched on the host in the decoded text.

The device ends a row at a stop token id by itself; a string can span tokens and a token
can hold more than the string, so only text can find it. After each dispatch the engine
decodes each such request's new tokens (`Text`: with a few before them, not the whole
completion; at first the prompt's last ones, `dsd_jax.detokenize`) and looks for its stop
strings in the text not yet searched (plus the overlap a string could straddle). The
completion then ends with the token that completed the first match, as if it had stopped
there: the device's rounds after it are dropped, and the row's slot is freed like any
finished one's.

As vLLM: the token ids keep every token up to the one that completed the match (earlier
tokens may already have been streamed: nothing is taken back), and the text ends where
the string starts (with `include_stop_str_in_output`, where it ends).
"""

from __future__ import annotations

import copy
from typing import Callable, NamedTuple, Sequence

from dsd_jax.detokenize import CONTEXT_TOKENS, INCOMPLETE, text_after


class Match(NamedTuple):
    keep: int      # completion tokens kept: the last is the one that completed the match
    text_end: int  # where the completion's text ends (in the decoded text of the kept tokens)
    stop: str      # the stop string matched


class Text:
    """A completion's text as it grows: `text` is the decoded text of its first `read`
    tokens, settled (no incomplete character at its end); `searched` counts the characters
    of the completion's text already searched (or, `SamplingParams.min_tokens`, where no
    match counts), which may run past `text` into characters settled before a last,
    incomplete one. Each call decodes the new tokens with `CONTEXT_TOKENS` before them (of
    the `prompt`'s at first), not the whole completion: a scan per dispatch then costs what
    the dispatch added, not what the completion holds."""

    def __init__(self, prompt: Sequence[int] = ()):
        self.text, self.read, self.searched = "", 0, 0
        self.prompt_tail = list(prompt[-CONTEXT_TOKENS:])

    def upto(self, decode: Callable[[list[int]], str], tokens: Sequence[int], n: int) -> tuple[str, bool]:
        """(the text of the first n >= `read` tokens without an incomplete last character,
        whether it had none); changes nothing."""
        context = (self.prompt_tail + list(tokens[max(0, self.read - CONTEXT_TOKENS):self.read]))[-CONTEXT_TOKENS:]
        new = text_after(decode, context, tokens[self.read:n])
        return self.text + new.rstrip(INCOMPLETE), not new.endswith(INCOMPLETE)

    def extend(self, decode: Callable[[list[int]], str], tokens: Sequence[int]) -> str:
        """Reads `tokens` (the whole completion so far) and counts their text as searched:
        the text up to its incomplete last character, if any, which is returned. `text` and
        `read` move only to a settled end (the next token may complete that character)."""
        text, settled = self.upto(decode, tokens, len(tokens))
        if settled:
            self.text, self.read = text, len(tokens)
        self.searched = max(self.searched, len(text))
        return text


def scan(decode: Callable[[list[int]], str], tokens: Sequence[int], at_least: int,
         stops: Sequence[str], text: Text, include: bool) -> Match | None:
    """Looks for `stops` in the completion `tokens` and reads them into `text`. A match must
    end past the text searched before: that text was searched by an earlier scan, or
    (`SamplingParams.min_tokens`, as vLLM) is the first tokens' text, where no match counts.
    A last character still incomplete (a byte-level tokenizer's multi-byte character split
    between tokens) is left for the next scan; the text before it is searched now, so a
    match is found in the dispatch whose token completes it.

    Returns the match that completes first, or None. Of two strings completed by the same
    token, the one that ends first in the text wins (then the one listed first). The kept
    count is at least `at_least`: the tokens already given out stay (and, as vLLM, the
    first min_tokens). `decode` is the tokenizer's (called on the new tokens and a few
    before them; again once per halving of the new tokens when a string is found)."""
    before = copy.copy(text)  # what earlier scans read
    searched, read = before.searched, before.read
    current = text.extend(decode, tokens)
    best = None
    for s in stops:
        i = current.find(s, max(0, searched - len(s) + 1))  # may straddle the old end
        if i >= 0 and (best is None or i + len(s) < best[0] + len(best[1])):
            best = (i, s)
    if best is None:
        return None
    i, s = best

    def holds(n: int) -> bool:  # the first n tokens' text already holds the match
        return before.upto(decode, tokens, n)[0][i:i + len(s)] == s

    lo, hi = max(at_least, read), len(tokens)  # holds(hi): the match is in `current`
    while lo < hi:  # the fewest tokens whose text holds it (prefix texts grow monotonically)
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return Match(lo, i + len(s) if include else i, s)


def stop_list(value, name: str = "stop", blank_too: bool = False,
              why: str = "an empty string would stop every completion before its first token"
              ) -> tuple[str, ...]:
    """Stop strings (or `name`'s strings) as a tuple of distinct non-empty strings (with
    `blank_too`, not only spaces either), in first-occurrence order: one string, a
    sequence of them, or None (none)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, (bytes, bytearray)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a string or a sequence of strings, got {value!r}")
    value = tuple(value)
    for j, s in enumerate(value):
        if not isinstance(s, str):
            raise ValueError(f"{name}[{j}] must be a string, got {s!r} ({type(s).__name__})")
        if not (s.strip() if blank_too else s):
            raise ValueError(f"{name}[{j}] is {'empty' if not s else 'blank'}: {why}")
    return tuple(dict.fromkeys(value))
