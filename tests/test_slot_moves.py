"""Slot moves in batches: `step.move_slots` does several swaps in one program call, and
`step.swap_batches` cuts a sequence of swaps where one call would not equal them in turn."""
import jax
import numpy as np
import pytest

from conftest import FixedK, make_engine
from dsd_jax import SamplingParams, step
from dsd_jax.buckets import move_buckets

SLOTS = 8


def test_move_buckets_hold_at_most_an_eighth_of_the_slots_and_a_caches_bytes():
    small = 1 << 10
    assert move_buckets(4, small) == (1,) and move_buckets(15, small) == (1,)
    assert move_buckets(16, small) == (1, 2) and move_buckets(64, small) == (1, 8)
    assert move_buckets(256, small) == (1, 32)
    mib = 1 << 20  # MOVE_ROWS_BYTES = 32 MiB: the built-in pair's slot at 2048 is 20 MiB
    assert move_buckets(64, 20 * mib) == (1,) and move_buckets(64, 5 * mib) == (1, 6)


def test_swap_batches_cut_before_a_slot_a_run_would_read_or_write_twice():
    none = SLOTS  # a dst out of range: free the src, move nothing
    cut = step.swap_batches
    assert cut([(7, 2), (6, 1), (5, 0)], 8, SLOTS) == [[(7, 2), (6, 1), (5, 0)]]
    assert cut([(7, 2), (6, 1), (5, 0)], 2, SLOTS) == [[(7, 2), (6, 1)], [(5, 0)]]
    assert cut([(7, 3), (3, 1)], 8, SLOTS) == [[(7, 3), (3, 1)]]           # a chain: src was a dst
    assert cut([(7, 3), (6, 7)], 8, SLOTS) == [[(7, 3)], [(6, 7)]]         # dst was a src
    assert cut([(7, 3), (6, 3)], 8, SLOTS) == [[(7, 3)], [(6, 3)]]         # dst twice
    assert cut([(7, 3), (7, 2)], 8, SLOTS) == [[(7, 3)], [(7, 2)]]         # src twice
    assert cut([(7, none), (6, none), (5, 1)], 8, SLOTS) == [[(7, none), (6, none), (5, 1)]]
    assert cut([], 8, SLOTS) == []


def _random_state(engine, seed):
    """The engine's state with every per-slot array filled with distinct random values."""
    rng = np.random.default_rng(seed)

    def fill(x):
        if x.dtype == bool:
            return jax.numpy.asarray(rng.random(x.shape) < 0.5)
        return jax.numpy.asarray(rng.integers(0, 1000, x.shape).astype(x.dtype))

    state = engine.new_state()
    fields, kv, drafter = jax.tree.map(fill, step.per_slot(state))
    return state._replace(**dict(zip(step._PER_SLOT, fields)), target_kv=kv, drafter=drafter)


def _swapped_in_turn(state, pairs):
    """The oracle: numpy, one swap after another, each src freed."""
    leaves, tree = jax.tree.flatten(step.per_slot(state))
    leaves = [np.array(x) for x in leaves]
    active_at = step._PER_SLOT.index("active")
    for src, dst in pairs:
        for x in leaves:
            if dst < SLOTS:
                x[[src, dst]] = x[[dst, src]]
        leaves[active_at][src] = False
    return jax.tree.unflatten(tree, leaves)


@pytest.mark.parametrize("per_call", [1, 3, 8])
def test_batched_swaps_equal_the_swaps_in_turn(tiny_pair, per_call):
    """Random sequences of swaps and frees over 8 slots (chains, repeats and conflicts
    included), cut by `swap_batches` and padded to a fixed size: every per-slot array, KV
    and drafter state included, ends as the swaps one by one leave it."""
    engine = make_engine(*tiny_pair, max_batch_size=SLOTS, max_seq_len=32, method="draft_model")
    rows, move = jax.jit(step.slot_rows), jax.jit(step.move_slots)
    rng = np.random.default_rng(per_call)
    for trial in range(6):
        state = _random_state(engine, trial)
        pairs = [(int(rng.integers(SLOTS)), int(rng.integers(SLOTS + 1))) for _ in range(int(rng.integers(1, 12)))]
        expected = _swapped_in_turn(state, pairs)
        for run in step.swap_batches(pairs, per_call, SLOTS):
            src = np.full(per_call, SLOTS, np.int32)  # padding
            dst = src.copy()
            src[:len(run)], dst[:len(run)] = zip(*run)
            state = move(state, src, dst, rows(state, dst))
        got = step.per_slot(state)
        for leaf, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(expected))):
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"trial {trial}, leaf {leaf}, pairs {pairs}")


def test_an_unchecked_batch_would_differ(tiny_pair):
    """The cut is needed: a pair whose dst was a src earlier in the call, done in the same
    call, leaves another state than the swaps in turn."""
    engine = make_engine(*tiny_pair, max_batch_size=SLOTS, max_seq_len=32)
    state = _random_state(engine, 0)
    pairs = [(7, 3), (6, 7)]
    src, dst = np.array([7, 6], np.int32), np.array([3, 7], np.int32)
    got = jax.jit(step.move_slots)(state, src, dst, jax.jit(step.slot_rows)(state, dst))
    expected = _swapped_in_turn(state, pairs)
    assert not all(np.array_equal(np.asarray(a), b) for a, b in
                   zip(jax.tree.leaves(step.per_slot(got)), jax.tree.leaves(expected)))


def _count_moves(engine) -> list[int]:
    """The size of each move program call the engine makes from now on."""
    calls, move = [], engine.programs.move

    def counted(m):
        program = move(m)  # compiled when the engine asks, as before
        return lambda *args: (calls.append(m), program(*args))[1]
    engine.programs.move = counted
    return calls


def test_requests_finishing_together_move_in_batches_and_keep_their_records(tiny_pair):
    """32 slots (moves of up to 4 swaps a call), requests of many lengths: the engine's
    outputs, its device state and its kept records are those of one swap a call, with a
    fraction of the calls."""
    target, draft = tiny_pair
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 64, int(rng.integers(3, 12))).tolist() for _ in range(48)]
    params = [SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 9))) for _ in prompts]
    results = {}
    for per_call in (4, 1):
        engine = make_engine(target, draft, FixedK([2]), max_batch_size=32, max_seq_len=32,
                             method="draft_model", num_speculative_tokens=2)
        assert engine.programs.move_rows == (1, 4)
        if per_call == 1:
            engine.programs.move_rows = (1,)
        calls = _count_moves(engine)
        outs = engine.generate(prompts, params)
        records = {slot: kept.sequence.tolist() for slot, kept in engine._retained[0].items()}
        held = jax.device_get(engine.state.tokens)
        for slot, sequence in records.items():
            assert held[slot, :len(sequence)].tolist() == sequence, slot
        results[per_call] = ([o.token_ids for o in outs], records, calls,
                             [np.asarray(x) for x in jax.tree.leaves(step.per_slot(engine.state))])
    (tokens4, records4, calls4, state4), (tokens1, records1, calls1, state1) = results[4], results[1]
    assert tokens4 == tokens1 and records4 == records1
    for a, b in zip(state4, state1):
        np.testing.assert_array_equal(a, b)
    assert 4 in calls4 and set(calls1) == {1}
    assert len(calls4) < len(calls1) / 2, (len(calls4), len(calls1))


def test_a_rollout_needing_a_larger_move_compiles_nothing_after_the_first(tiny_pair):
    """The first rollout moves nothing (32 requests finishing together, each in the last
    live slot); the second moves 4 a call: every move size compiled at the first, so the
    second compiles nothing (an RL loop's rollouts)."""
    from dsd_jax.compilation import compilation_count
    target, draft = tiny_pair
    engine = make_engine(target, draft, FixedK([2]), max_batch_size=32, max_seq_len=32, batch_buckets=(32,),
                         method="draft_model", num_speculative_tokens=2)
    prompts = [[3 + i % 7, 4, 5] for i in range(32)]
    calls = _count_moves(engine)
    engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4))
    assert calls == []
    before = compilation_count()
    engine.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=1 + i % 5) for i in range(32)])
    assert compilation_count() == before and 4 in calls
