"""Prompts that begin alike, prefilled once: which new requests copy a shared prefix.

A batch-generation job often sends many prompts behind one long preamble (a system
prompt, few-shot examples). At an admission, on one data shard, a new request whose
prompt begins with at least `MIN_SHARED_PREFIX` tokens of a running request's prompt, or
of an earlier new one's, is not prefilled from position 0: once that prompt (its donor) is
in its slot, the engine copies the donor's slot into the request's (`step.copy_slots`:
target KV, drafter state, tokens) and prefills only the positions after the shared ones.

It is the analogue of vLLM's automatic prefix caching, narrower: the KV cache is one dense
row per slot, so a finished request's prompt is not kept to be reused later; only the
prompts a shard holds can donate. Host-only (numpy): the plan is made before anything runs.
The engine passes running requests first, as donors that may not take.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MIN_SHARED_PREFIX", "common_prefix", "plan"]

# Fewer shared positions than this are prefilled again: so short a share saves little
# against a whole-slot copy and a second prefill (whether a longer one pays is the engine's
# cost rule, `SpecEngine._plan_sharing`), and the donors are then found by one dict key.
MIN_SHARED_PREFIX = 32


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two token arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def plan(prompts: Sequence[Sequence[int]], may_share: Sequence[bool],
         min_shared: int = MIN_SHARED_PREFIX) -> list[tuple[int, int] | None]:
    """For each prompt, in order: None (it takes no share, and may donate to later ones),
    or (donor index, shared positions) with the donor an earlier prompt that takes none.

    The shared positions stop before either prompt's last token: a prompt's last token is
    pending (the first round processes it), so a donor's prefill covers positions
    < len - 1 only, and the request writes its own last token. The longest share wins, the
    earliest donor on a tie. A prompt with may_share False takes none: a running request
    (already in its slot), or one asking for prompt logprobs (only its own prefill
    computes them)."""
    arrays = [np.asarray(p, np.int64) for p in prompts]
    donors: dict[tuple[int, ...], list[int]] = {}  # donors by their first min_shared tokens
    out: list[tuple[int, int] | None] = []
    for i, tokens in enumerate(arrays):
        key = tuple(tokens[:min_shared].tolist())
        best = None
        if may_share[i] and len(tokens) > min_shared:
            for d in donors.get(key, ()):  # the same first min_shared tokens, both longer
                shared = common_prefix(tokens[:len(tokens) - 1], arrays[d][:len(arrays[d]) - 1])
                if best is None or shared > best[1]:
                    best = (d, shared)
        out.append(best)
        if best is None and len(tokens) > min_shared:
            donors.setdefault(key, []).append(i)
    return out
