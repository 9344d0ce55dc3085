"""What moving finished requests' slots costs one swap a call against several a call.

The engine keeps live requests packed: each finished request's slot swaps with the
shard's last live one (`step.slot_rows` then `step.move_slots`, two programs). Since
`SpecEngine._move_slots` the swaps of a step go up to `buckets.move_buckets(slots)[-1]`
to a call (8 at 64 slots), where each swap was its own two calls.

Variants, on the built-in pair's engine state at 64 slots (the engine's own compiled
programs, the state donated as the engine runs them), 8 swaps of the last 8 slots into
the first 8, one variant after the other in random order each repeat, paired:
- "one a call": 8 x (`slot_rows(1)`, `move(1)`);
- "8 a call": `slot_rows(8)`, `move(8)`.
Per repeat each variant's time is the median of 3 calls. Run at several max_seq_len: from
short ones, where a slot is small and program calls cost most, to 2048, where bytes do.
The floor: each swap reads and writes about 3 slots' bytes (copy in, rows out, rows back),
at this machine's memcpy bandwidth (numpy's copy between two buffers of those bytes,
interleaved with the variants).
Usage: python batched_swaps.py [repeats] [max_seq_len,...]"""
import random
import sys
import time

import jax
import numpy as np

import dsd_jax as dsd
from dsd_jax import step
from dsd_jax.models.builtin import builtin
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
LENGTHS = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [64, 256, 512, 2048]
SLOTS, SWAPS = 64, 8
FLOOR = "floor: memcpy of 3 slots a swap"
target, draft, _ = builtin()


def measure(max_seq_len: int) -> None:
    engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=4),
                            max_batch_size=SLOTS, max_seq_len=max_seq_len, batch_buckets=(SLOTS,))
    programs = engine.programs  # (its move_rows does not matter here: each variant asks its own)
    pairs = [(SLOTS - 1 - i, i) for i in range(SWAPS)]

    def one_a_call():
        for src, dst in pairs:
            s, d = np.array([[src]], np.int32), np.array([[dst]], np.int32)
            engine.state = programs.move(1)(engine.state, s, d, programs.slot_rows(1)(engine.state, d))

    def all_in_one():
        s, d = np.array([[a for a, _ in pairs]], np.int32), np.array([[b for _, b in pairs]], np.int32)
        engine.state = programs.move(SWAPS)(engine.state, s, d, programs.slot_rows(SWAPS)(engine.state, d))

    slot_bytes = sum(x.nbytes // SLOTS for x in jax.tree.leaves(step.per_slot(engine.state)))
    source, target_buffer = np.ones(3 * SWAPS * slot_bytes, np.uint8), np.zeros(3 * SWAPS * slot_bytes, np.uint8)
    variants = {"one a call": one_a_call, f"{SWAPS} a call": all_in_one,  # floor: memcpy, in place
                FLOOR: lambda: np.copyto(target_buffer, source)}
    for fn in variants.values():  # compile
        fn()
    jax.block_until_ready(engine.state)

    def timed(fn, calls=3):
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            jax.block_until_ready(engine.state)
            out.append(time.perf_counter() - t0)
        return float(np.median(out))

    times = {v: [] for v in variants}
    order = list(variants)
    for r in range(REPEATS):
        random.Random(r).shuffle(order)
        for v in order:
            times[v].append(timed(variants[v]))
    print(f"max_seq_len {max_seq_len}: {slot_bytes / 2**20:.3f} MiB a slot, {SWAPS} swaps, {REPEATS} paired repeats")
    for v in variants:
        t = np.median(times[v])
        print(f"  {v}: {1e3 * t:.3f} ms ({1e3 * t / SWAPS:.3f} ms a swap), "
              f"{3 * SWAPS * slot_bytes / t / 1e9:.2f} GB/s of 3 slots a swap")
    print(f"  {SWAPS} a call / one a call: {format_ratio(paired_ratio(times[f'{SWAPS} a call'], times['one a call']), digits=3)}")
    print(f"  {SWAPS} a call / floor: {format_ratio(paired_ratio(times[f'{SWAPS} a call'], times[FLOOR]), digits=3)}")


for length in LENGTHS:
    measure(length)
