"""The shapes programs are compiled for: batch buckets and prompt-chunk buckets, and the
least-cost cut of a prompt into chunks. Host-side, numpy only."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def power_of_two_buckets(max_size: int) -> tuple[int, ...]:
    buckets = [1]
    while buckets[-1] < max_size:
        buckets.append(min(buckets[-1] * 2, max_size))
    return tuple(buckets)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= n (the compiled program that serves n rows or tokens)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


# The most bytes of rows a slot-move call holds: about a last-level cache, since the rows
# program writes them and the move reads them straight back. On this repo's CPU (32 MiB L3)
# 8 swaps a call against one a call took 0.46x at 5.6 MiB of rows, 0.85x at 21, 0.91x at
# 41, but 1.31x at 81 and up to 1.39x at 161 (`benchmarks/results/prefix_sharing/batched_swaps.py`).
MOVE_ROWS_BYTES = 32 << 20


def move_buckets(slots: int, slot_bytes: int) -> tuple[int, ...]:
    """Swaps per slot-move program call (`step.move_slots`) for a shard of `slots` slots of
    `slot_bytes` each: 1, and as many as hold at most an eighth of the slots and
    `MOVE_ROWS_BYTES` (the call holds their rows). Two sizes keep the compiles few; a call
    padded to the larger one reads a row per padding pair and moves nothing for it."""
    return tuple(sorted({1, max(1, min(slots // 8, MOVE_ROWS_BYTES // max(slot_bytes, 1)))}))


def chunk_buckets(largest: int) -> tuple[int, ...]:
    """Prompt-chunk sizes compiled for prefill: 16, 32, 64, ... up to `largest` (included).
    Doubling steps let any prompt up to `largest` run as one piece padded by < 2x (and
    by < 16 tokens past that)."""
    sizes, c = {largest}, 16
    while c < largest:
        sizes.add(c)
        c *= 2
    return tuple(sorted(sizes))


def usable_chunks(chunks: Sequence[int], longest: int) -> tuple[int, ...]:
    """The sizes of `chunks` that `prefill_pieces` cuts some prompt of 1..`longest` tokens
    into; compiling the others would be for nothing (with max_seq_len 160, a 159-token
    prompt runs as 128 + 32, so the 256 chunk never runs). The pieces of every such prompt
    are the same with only these sizes (`tests/test_engine.py`)."""
    largest = max(chunks)
    # a prompt over the largest chunk runs whole largest chunks, then a rest of 1..largest
    used = {largest} if longest > largest else set()
    for length in range(1, min(longest, largest) + 1):
        used.update(c for _, c in prefill_pieces(length, chunks))
    return tuple(sorted(used))


def prefill_pieces(length: int, chunks: Sequence[int]) -> list[tuple[int, int]]:
    """(start, chunk size) pieces covering `length` prompt tokens at the least cost, where
    a piece costs its padded tokens plus a fixed overhead worth two of the smallest chunk:
    a dispatch has a fixed cost and small chunks run the matmuls at small M (measured on
    XLA:CPU with the built-in target: 16 tokens 20-24 ms, 32 tokens 26-30, 64 tokens 29-44,
    128 tokens 48, 256 tokens 127-143). So a 56-token prompt runs as one padded 64 (not
    4 x 16), an 84-token one as 128, a 140-token one as 128 + 16 (not a padded 256)."""
    largest = max(chunks)
    cost = lambda plan: _pieces_cost(plan, chunks)

    def plan_for(rest: int) -> list[int]:  # rest <= largest
        if rest <= 0:
            return []
        cover = [bucket_for(rest, chunks)]
        fitting = [c for c in chunks if c <= rest]
        if not fitting:
            return cover
        split = [max(fitting)] + plan_for(rest - max(fitting))
        return min(cover, split, key=cost)  # a tie keeps the single piece

    sizes = [largest] * max(0, -(-length // largest) - 1)
    sizes += plan_for(length - sum(sizes))
    starts = np.cumsum([0] + sizes[:-1])
    return [(int(s), c) for s, c in zip(starts, sizes)]


def _pieces_cost(sizes: Sequence[int], chunks: Sequence[int]) -> int:
    """A row's cost of prefill pieces of these sizes, in tokens: the padded tokens plus a
    fixed overhead per piece worth two of the smallest chunk (`prefill_pieces`)."""
    return sum(sizes) + 2 * min(chunks) * len(sizes)


def prefill_cost(length: int, chunks: Sequence[int]) -> int:
    """What prefilling `length` prompt tokens costs a row, in tokens, cut as
    `prefill_pieces` cuts them (every row of a prefill runs the longest row's pieces)."""
    return _pieces_cost([c for _, c in prefill_pieces(length, chunks)], chunks)


def serving_buckets(table, batch_sizes: Sequence[int], candidates: Sequence[int] | None = None,
                    margin: float = 0.0) -> dict[int, int]:
    """{bucket: the larger bucket to run its batches in} from a latency table [context,
    batch, K] over `batch_sizes`: a bucket is served by a larger one when that one is more
    than `margin` faster at every context and K (the cheapest such, by its summed latency).

    A part-filled bucket is just a bucket, so a batch may run in any program at least its
    size. Usually the smallest is the cheapest; but on an H200 a one-row forward took 1.36x
    (8B target) and 1.50x (1B draft) as long as a two-row one, XLA compiling one-row dots
    into more kernels. `candidates` limits both sides to the buckets an engine compiled."""
    t = np.asarray(table, dtype=float)
    sizes = list(batch_sizes)
    allowed = set(sizes if candidates is None else candidates)
    serve = {}
    for i, s in enumerate(sizes):
        if s not in allowed:
            continue
        faster = [j for j in range(i + 1, len(sizes)) if sizes[j] in allowed
                  and np.all(t[:, j] * (1.0 + margin) < t[:, i])]
        if faster:
            serve[s] = sizes[min(faster, key=lambda j: t[:, j].sum())]
    return serve
