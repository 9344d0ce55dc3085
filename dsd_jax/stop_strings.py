"""Stop strings (vLLM's `SamplingParams.stop`), matched on the host in the decoded text.

The device ends a row at a stop token id by itself; a string can span tokens and a token
can hold more than the string, so only text can find it. After each dispatch the engine
decodes each such request's completion and looks for its stop strings in the text not yet
searched (plus the overlap a string could straddle). The completion then ends with the
token that completed the first match, as if it had stopped there: the device's rounds
after it are dropped, and the row's slot is freed like any finished one's.

As vLLM: the token ids keep every token up to the one that completed the match (earlier
tokens may already have been streamed: nothing is taken back), and the text ends where
the string starts (with `include_stop_str_in_output`, where it ends).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

# What a byte-level tokenizer decodes an incomplete UTF-8 sequence to. A completion's last
# characters may be such a placeholder until the next token completes them, so the text
# searched stops before them.
INCOMPLETE = "\ufffd"


class Match(NamedTuple):
    keep: int      # completion tokens kept: the last is the one that completed the match
    text_end: int  # where the completion's text ends (in the decoded text of the kept tokens)
    stop: str      # the stop string matched


def settled_text(decode: Callable[[list[int]], str], tokens: Sequence[int]) -> str:
    """The decoded text of `tokens` without a trailing incomplete character."""
    return decode(list(tokens)).rstrip(INCOMPLETE)


def scan(decode: Callable[[list[int]], str], tokens: Sequence[int], committed: int,
         stops: Sequence[str], searched: int, include: bool) -> tuple[Match | None, int]:
    """Looks for `stops` in the completion `tokens`, of which the first `committed` were
    searched before (their text up to `searched` characters, found free of every string).

    Returns (the match that completes first, or None; the characters now searched). Of two
    strings completed by the same token, the one that ends first in the text wins (then the
    one listed first). The kept count is at least `committed`: tokens already given out
    stay. `decode` is the tokenizer's (called once, and once per halving of the new tokens
    when a string is found)."""
    text = settled_text(decode, tokens)
    start = max(0, searched - max(map(len, stops)) + 1)  # a string straddling the old end
    best = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i + len(s) < best[0] + len(best[1])):
            best = (i, s)
    if best is None:
        return None, len(text)
    i, s = best

    def holds(n: int) -> bool:  # the first n tokens' text already holds the match
        return settled_text(decode, tokens[:n])[i:i + len(s)] == s

    lo, hi = committed, len(tokens)  # holds(hi) is true: the match is in the whole text
    while lo < hi:  # the fewest tokens whose text holds it (prefix texts grow monotonically)
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return Match(lo, i + len(s) if include else i, s), len(text)


def stop_list(value, name: str = "stop") -> tuple[str, ...]:
    """Stop strings as a tuple of distinct non-empty strings, in first-occurrence order: one
    string, a sequence of them, or None (none)."""
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
        if not s:
            raise ValueError(f"{name}[{j}] is empty: an empty string would stop every completion "
                             "before its first token")
    return tuple(dict.fromkeys(value))
