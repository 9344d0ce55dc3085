"""Finished rollouts kept on the host, to draft the next epoch's rollouts of the same prompts.

RL loops sample the same prompts epoch after epoch, and last epoch's completions share
long stretches with this epoch's (SPEC-RL, DAS). `SpecEngine.generate(..., memory=m)`
gives each request the stored completions of its prompt as references (method "suffix"
searches them on device) and stores the new completions when the call returns.

Bounded: at most `max_prompts` prompts (the least recently used is evicted first) and
`per_prompt` completions each (the oldest go first).
"""

from __future__ import annotations

import collections
from typing import Sequence

from dsd_jax.inputs import check_size


class RolloutMemory:
    def __init__(self, max_prompts: int = 4096, per_prompt: int = 16):
        # the engine's size check: None, a float (inf, NaN, 2.0), "8" or True is a ValueError
        self.max_prompts = check_size("max_prompts", max_prompts, 1)
        self.per_prompt = check_size("per_prompt", per_prompt, 1)
        self._store: collections.OrderedDict[tuple, collections.deque] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def references(self, prompt: Sequence[int]) -> list[list[int]]:
        """The stored completions of `prompt`, oldest first (a copy)."""
        return [tokens for tokens, _ in self.entries(prompt)]

    def entries(self, prompt: Sequence[int]) -> list[tuple[list[int], int | None]]:
        """The stored completions of `prompt` with the seed each one's noise was drawn from
        (None: not given), oldest first: the engine keeps the next draw's noise apart from
        theirs (`SamplingParams`)."""
        key = tuple(int(t) for t in prompt)
        stored = self._store.get(key)
        if stored is None:
            return []
        self._store.move_to_end(key)
        return [(list(tokens), seed) for tokens, seed in stored]

    def add(self, prompt: Sequence[int], completion: Sequence[int], noise_seed: int | None = None) -> None:
        """Stores one finished completion of `prompt` (empty completions are skipped), with the
        seed its noise was drawn from (`RequestOutput.noise_seed`; the engine passes it)."""
        completion = tuple(int(t) for t in completion)  # not `not completion`: a numpy array's truth
        if not completion:
            return
        key = tuple(int(t) for t in prompt)
        stored = self._store.get(key)
        if stored is None:
            stored = self._store[key] = collections.deque(maxlen=self.per_prompt)
            while len(self._store) > self.max_prompts:
                self._store.popitem(last=False)
        self._store.move_to_end(key)
        stored.append((completion, None if noise_seed is None else int(noise_seed)))
