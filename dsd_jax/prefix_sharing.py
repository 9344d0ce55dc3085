"""Prompts that begin alike, prefilled once: which new requests copy a shared prefix.

A batch-generation job often sends many prompts behind one long preamble (a system
prompt, few-shot examples). At an admission, on one data shard, a new request whose
prompt begins with at least `MIN_SHARED_PREFIX` tokens of a running request's prompt, or
of an earlier new one's, is not prefilled from position 0: once that prompt (its donor) is
in its slot, the engine copies the donor's slot into the request's (`step.copy_slots`:
target KV, drafter state, tokens) and prefills only the positions after the shared ones.

A finished request donates too: the move that keeps live requests packed swaps its slot
with the last live one (`step.move_slots`), so a free slot keeps what the request left, its
prompt and completion (`Retained`), until an admission takes the slot, in this run or a
later call on the same weights. A multi-turn rollout whose next prompt is the last one
plus its completion and a new message prefills only the new message. A request taking
such a share is seated in its donor's slot when that slot is among the ones being filled
(`seat`): nothing is copied. A kept record in a slot being filled for another request
moves out of the way first (`preserve`): to the kept slot its taker leaves, to a free slot
that keeps nothing, or over an older record (least recently kept first), so requests
arriving a few at a time (one thread per episode) do not overwrite each other's records.

It is the analogue of vLLM's automatic prefix caching, narrower: the KV cache is one dense
row per slot, so what a shard can reuse is what its slots hold, at most one request per
slot. Host-only (numpy): the plan is made before anything runs. The engine passes running
requests and retained slots first, as donors that may not take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["MIN_SHARED_PREFIX", "Retained", "common_prefix", "drafter_held", "place", "plan", "preserve",
           "retained", "seat"]

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


def longest_shares(prompts: Sequence[Sequence[int]], donors: Sequence[Sequence[int]],
                   min_shared: int = MIN_SHARED_PREFIX) -> list[int]:
    """For each prompt, the most positions it could take from one of `donors` as `plan`
    counts them (0 below `min_shared`)."""
    by_key: dict[tuple[int, ...], list[np.ndarray]] = {}
    for d in donors:
        if len(d) > min_shared:
            by_key.setdefault(tuple(d[:min_shared]), []).append(np.asarray(d, np.int64))
    out = []
    for p in prompts:
        p = np.asarray(p, np.int64)
        found = by_key.get(tuple(p[:min_shared].tolist()), ()) if len(p) > min_shared else ()
        out.append(max((common_prefix(p[:len(p) - 1], d[:len(d) - 1]) for d in found), default=0))
    return out


def place(prompts: Sequence[Sequence[int]], donors: Sequence[Sequence[Sequence[int]]],
          quota: Sequence[int]) -> list[int | None]:
    """Data shards for new prompts, given each shard's donors (its running prompts and kept
    sequences) and how many new requests each takes (`quota`, the balance least-loaded
    placement gives): the prompts with most to gain first, each to the shard with its
    longest share that still takes one. None: nothing to gain anywhere, place it freely."""
    shares = np.array([longest_shares(prompts, d) for d in donors]).reshape(len(donors), len(prompts))
    left = list(quota)
    out: list[int | None] = [None] * len(prompts)
    for i in sorted(range(len(prompts)), key=lambda i: -int(shares[:, i].max(initial=0))):
        open_shards = [s for s in range(len(left)) if left[s] > 0]
        s = max(open_shards, key=lambda s: shares[s, i], default=None)
        if s is None or shares[s, i] == 0:
            continue
        out[i] = s
        left[s] -= 1
    return out


def drafter_held(prompt_length: int, prompt_drafted: bool, shared: int) -> int | None:
    """None when a taker of `shared` positions finds its donor's drafter state good below
    them (the donor's prompt, of `prompt_length`, was drafted and covers the share); else
    the `drafter_length` to admit it with, the donor's drafted prompt (all of it, or nothing
    when that prompt was left to a catch-up), so that its drafter catches up the rest in its
    first round with K > 0. A drafter's state past the prompt is unknown to the host: a
    draft model lags after K = 0 rounds, an EAGLE-3 head's entries too."""
    held = prompt_length if prompt_drafted else 1
    return None if shared <= held - 1 else held


class Retained(NamedTuple):
    """What a free slot holds: what the request that finished in it wrote."""

    sequence: np.ndarray  # prompt and completion; the target KV holds positions < len - 1
    prompt_length: int
    prompt_drafted: bool  # the drafter's state holds the prompt (`Request.prompt_drafted`)
    finished: int = 0  # when it was kept (the engine's count of finished requests): its age

    def drafter_held(self, shared: int) -> int | None:
        """`drafter_held` of this slot's prompt."""
        return drafter_held(self.prompt_length, self.prompt_drafted, shared)


def retained(prompt: Sequence[int], tokens: Sequence[int], prompt_drafted: bool, finished: int = 0) -> Retained:
    """The `Retained` record of a finished request (tokens: what the host returned; the
    device may have run on past a stop string, but its positions before agree)."""
    return Retained(np.asarray(list(prompt) + list(tokens), np.int64), len(prompt), prompt_drafted, finished)


def seat(requests: list, base: int, donor_slot: dict[int, int]) -> list:
    """The new requests of one shard in the order of slots base, base + 1, ...: a request
    whose donor is a free slot in that range (`donor_slot`: id(request) -> slot) sits in
    it, one per donor slot. Its share is then in place, and a slot some request copies from
    is never the destination of another's copy or of a whole prefill."""
    order: list = [None] * len(requests)
    seated = set()
    for r in requests:
        at = donor_slot.get(id(r), -1) - base
        if 0 <= at < len(order) and order[at] is None:
            order[at] = r
            seated.add(id(r))
    rest = iter([r for r in requests if id(r) not in seated])
    return [r if r is not None else next(rest) for r in order]


class Preserved(NamedTuple):
    """How one shard's kept records get out of the way of an admission (`preserve`)."""

    swaps: list[tuple[int, int]]  # (a, b): slots a and b exchange contents, in this order
    copies: list[tuple[int, int]]  # (source, destination): after the swaps, in one program
    where: dict[int, int]  # slot -> the slot its content (and record) is in afterwards
    evicted: list[int]  # slots whose records the copies overwrite

    def moved(self, records: dict) -> dict:
        """`records` (slot -> record) after the swaps and copies: each where its content
        went, the evicted ones gone."""
        return {self.where.get(slot, slot): r for slot, r in records.items() if slot not in self.evicted}


def preserve(base: int, end: int, slots: int, kept: dict[int, int], takes: dict[int, int]) -> Preserved:
    """Saves the kept records in slots base..end - 1, which new requests are about to write,
    when no seated taker uses them (`seat`). `kept`: the slots holding a record -> its age
    (`Retained.finished`, larger is newer); `takes`: new request's slot -> the kept slot it
    takes a share from.

    A taker sitting on another record whose own donor lies beyond the range swaps slots with
    it: the share is then in place and the record sits in the donor's slot (two slot copies,
    `step.move_slots`, where copying the donor over the record lost it). The other records
    in the range, newest first, are copied to free slots beyond it that keep nothing, and
    when none is left over the oldest record beyond it that is older and no taker uses (the
    least recently kept goes first, as vLLM evicts its prefix cache's blocks). A donor's
    other takers copy from wherever its content went (`where`)."""
    at_risk = [slot for slot in range(base, end) if slot in kept and takes.get(slot) != slot]
    swaps, where = [], {}
    for slot in list(at_risk):
        donor = takes.get(slot)
        if donor is not None and donor >= end and donor not in where:
            swaps.append((donor, slot))
            where[donor], where[slot] = slot, donor
            at_risk.remove(slot)
    empty = [slot for slot in range(end, slots) if slot not in kept]
    donors = set(takes.values())
    oldest = sorted((slot for slot in range(end, slots) if slot in kept and slot not in donors), key=kept.get)
    copies, evicted = [], []
    for slot in sorted(at_risk, key=kept.get, reverse=True):
        if empty:
            copies.append((slot, empty.pop(0)))
        elif oldest and kept[oldest[0]] < kept[slot]:
            evicted.append(oldest.pop(0))
            copies.append((slot, evicted[-1]))
    where.update(copies)
    return Preserved(swaps, copies, where, evicted)
