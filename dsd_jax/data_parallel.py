"""Data parallelism: every program runs once per "data" shard, on that shard's own slots.

The decode state's slot axis is split on "data" (`dsd_jax.sharding`), so shard s holds
slots s*n .. s*n+n-1 (n = slots per shard). Each shard keeps its live requests packed in
its local slots 0..n_s-1, and the (K, bucket) program runs on the first b local slots of
every shard, b chosen by the engine from the fullest shard. Taking the first B *global*
slots instead would put every live request on shard 0 and leave the others idle.

Host arguments (slot indices, prompt chunks, per-slot settings) carry a leading [data]
axis, one entry per shard, and are passed replicated, so every process of a multi-host
run hands the same numpy arrays to the same program; each shard picks its own entry.
Outputs are concatenated shard after shard along the batch axis and come back
replicated (a multi-host process can only read arrays it holds in full).

Only two things cross shards: the cumulative acceptance counters (a psum of each shard's
increments) and whether any row is still active (a psum, so every shard runs the same
number of rounds and the dispatch returns one round count). The "model" axis stays
automatic inside (GSPMD), and the Pallas kernels run under their own shard_map over it.
With data = 1 the wrappers only drop the leading axis, so the single-device programs
are the ones they always were.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from dsd_jax.sharding import DATA

HOST, PARAMS, STATE = "host", "params", "state"  # how each argument of a program is laid out


def per_shard(fn, mesh, data: int, state_specs, kinds, out_specs):
    """`fn` run on each data shard's slots.

    kinds: one of HOST (leading [data] axis, replicated: the shard takes its entry),
    PARAMS (replicated over "data") or STATE (slots split on "data", `state_specs`
    naming only that axis), or the argument's own in_specs, per positional argument.
    out_specs: the shard_map out_specs (over "data" only).
    """
    def local(*args):
        shard = jax.lax.axis_index(DATA) if data > 1 else 0
        args = [jax.tree.map(lambda x: x[shard], a) if kind == HOST else a
                for a, kind in zip(args, kinds)]
        return fn(*args)

    if data == 1:
        return local
    in_specs = tuple({HOST: P(), PARAMS: P(), STATE: state_specs}[k] if isinstance(k, str) else k
                     for k in kinds)
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         axis_names=frozenset({DATA}), check_vma=False)


def any_active(data: int):
    """The rounds loop's "any row still active" test: over every shard when data > 1."""
    if data == 1:
        return jnp.any
    return lambda active: jax.lax.psum(jnp.any(active).astype(jnp.int32), DATA) > 0


def summed_counters(data: int, before, after):
    """The state `after` a shard's rounds with the acceptance counters summed over shards
    (each shard counted only its own rows, starting from the same replicated totals)."""
    if data == 1:
        return after
    def total(old, new):
        return old + jax.lax.psum(new - old, DATA)
    return after._replace(
        accepted_per_pos=total(before.accepted_per_pos, after.accepted_per_pos),
        proposed_per_pos=total(before.proposed_per_pos, after.proposed_per_pos))
