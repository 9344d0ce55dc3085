"""What keeping a finished request's slot costs: `step.move_slots` swaps two slots where the
move it replaced copied one (`copy_slots` of the last live slot into the freed one).

Variants on the built-in pair's decode state (8 slots, max_seq_len 2048, K <= 4), jitted
with the state donated as the engine runs them, called in random order within each repeat;
per call: the median of 5 calls, 40 repeats paired. "copy": the old move. "swap": the
engine's, `step.slot_rows` (the destination's rows, a program of its own) then
`step.move_slots`. "swap_in_one": the first version, both rows swapped inside one program,
which XLA compiled to copies of every per-slot array whole. The bytes a slot holds (every
per-slot array, target and draft KV included) give the floor: a copy reads and writes one
slot, a swap two. Usage: python swap_cost.py [repeats]"""
import random
import sys
import time

import jax
import numpy as np

import dsd_jax as dsd
from dsd_jax import step
from dsd_jax.models.builtin import builtin
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
target, draft, _ = builtin()
engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=4), max_batch_size=8, max_seq_len=2048)


def copy_move(state, src, dst):  # the move before the swap
    moved = step.copy_slots(state, src, dst)
    return moved._replace(active=moved.active.at[src].set(False, mode="drop"))


def swap_in_one(state, src, dst):  # both rows read and written in one program
    def swap(x):
        a, b = jax.lax.dynamic_index_in_dim(x, src, 0), jax.lax.dynamic_index_in_dim(x, dst, 0)
        return jax.lax.dynamic_update_index_in_dim(jax.lax.dynamic_update_index_in_dim(x, a, dst, 0), b, src, 0)

    fields, kv, drafter = jax.tree.map(swap, step.per_slot(state))
    return state._replace(**dict(zip(step._PER_SLOT, fields)), target_kv=kv, drafter=drafter)


rows, move = jax.jit(step.slot_rows), jax.jit(step.move_slots, donate_argnums=0)
programs = {"copy": jax.jit(copy_move, donate_argnums=0), "swap": lambda st, s, d: move(st, s, d, rows(st, d)),
            "swap_in_one": jax.jit(swap_in_one, donate_argnums=0)}
state = engine.new_state()
src, dst = np.int32(7), np.int32(2)
slot_bytes = sum(x.nbytes // x.shape[0] for x in jax.tree.leaves(state))
for fn in programs.values():  # compile
    state = fn(state, src, dst)
jax.block_until_ready(state)


def timed(name, calls=5):
    global state
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        state = jax.block_until_ready(programs[name](state, src, dst))
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


times = {v: [] for v in programs}
order = list(programs)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        times[v].append(timed(v))
print(f"{REPEATS} pairs; built-in pair, 8 slots, max_seq_len 2048: {slot_bytes / 2**20:.2f} MiB a slot")
for v, moved in (("copy", 2), ("swap", 4), ("swap_in_one", 4)):
    t = np.median(times[v])
    print(f"{v}: {1e3 * t:.3f} ms a call, {moved * slot_bytes / t / 1e9:.2f} GB/s of slot reads and writes")
for v in ("swap", "swap_in_one"):
    print(f"{v}/copy {format_ratio(paired_ratio(times[v], times['copy']), digits=3)}")
