"""Whether a request's token constraints can leave it nothing to draw.

`allowed_token_ids`, `bad_words` and min_tokens' ban on the stop ids each set ids to -inf.
Together they can ban every id at some position: allowed [a, b] with the bad words "b"
and "a a" bans both once the completion ends in a. The sampler would then draw from all
-inf (NaN logprobs, a banned id), so the engine refuses such a request up front.

A bad word bans its last token where the completion so far ends in the rest of it
(`bad_words`; the prompt never counts), so what a position bans depends only on the
completion's longest suffix that is a prefix of some bad word: the states of an
Aho-Corasick automaton over the prefixes. The search walks them from the empty completion
through the ids a row may draw; a stop id ends the completion where it is drawn.
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence


class _Prefixes:
    """The bad words' prefixes: what each completion suffix bans, and where each id leads."""

    def __init__(self, sequences: Iterable[Sequence[int]]):
        self.bans: dict[tuple, set[int]] = {}  # a prefix -> the last ids it bans
        self.children: dict[tuple, set[int]] = {(): set()}  # a prefix -> the ids extending it
        for seq in map(tuple, sequences):
            self.bans.setdefault(seq[:-1], set()).add(seq[-1])
            for k in range(len(seq) - 1):
                self.children[seq[:k]].add(seq[k])
                self.children.setdefault(seq[:k + 1], set())

    def _suffixes(self, state: tuple) -> list[tuple]:
        """The state's suffixes that are prefixes, () included."""
        return [state[j:] for j in range(len(state) + 1) if state[j:] in self.children]

    def banned(self, state: tuple) -> set[int]:
        return set().union(*(self.bans.get(s, ()) for s in self._suffixes(state)))

    def leading(self, state: tuple) -> set[int]:
        """The ids after which the completion ends in a prefix other than (); the rest lead to ()."""
        return set().union(*(self.children[s] for s in self._suffixes(state)))

    def after(self, state: tuple, token: int) -> tuple:
        longer = state + (token,)
        return next(longer[j:] for j in range(len(longer) + 1) if longer[j:] in self.children)


@functools.lru_cache(maxsize=256)
def first_stuck(sequences: tuple[tuple[int, ...], ...], allowed: tuple[int, ...] | None, vocab: int,
                stop_ids: tuple[int, ...], min_tokens: int) -> tuple[int, tuple] | None:
    """`(position, tail)`: the first completion position (0-based) at which a completion
    the constraints allow can find every id banned, and the tokens before it that make it
    so (the bad words' part of the completion); None if none can get stuck. A request
    that draws at most `position` tokens never gets there. (Memoised: an RL loop sends
    the same constraints with every request, and a large set takes ~0.2 s.)

    sequences: the bad words' token sequences; allowed: allowed_token_ids (None: the
    vocabulary); stop_ids: the stop ids, end-of-text ones included, banned at positions
    below min_tokens and ending the completion at or after it.

    Where a completion can go next does not depend on its position (a stop id never
    continues it, banned or not), only whether it is stuck does, and a state stuck once
    min_tokens' ban is over is stuck under it too. So the first position a state can be
    stuck at is the first it is reached at: one breadth-first pass, each state once."""
    prefixes, stops = _Prefixes(sequences), set(stop_ids)
    pool = set(range(vocab)) if allowed is None else set(allowed)
    frontier, seen, position = [()], {()}, 0
    while frontier:
        following = []
        for state in frontier:
            banned = prefixes.banned(state) | (stops if position < min_tokens else set())
            if len(pool) == len(pool & banned):  # (counted through the few ids banned)
                return position, state
            leading = prefixes.leading(state)
            nexts = {prefixes.after(state, t) for t in (leading & pool) - banned - stops}
            if len(pool) > len(pool & (banned | stops | leading)):  # an id that leads back to ()
                nexts.add(())
            following += sorted(nexts - seen)
            seen |= nexts
        frontier, position = following, position + 1
    return None
