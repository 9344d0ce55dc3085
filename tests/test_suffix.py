"""Method "suffix": lookup over the slot's own tokens, its group's live siblings and the
references uploaded at admission. Lossless like any drafter; no cross-group proposals."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import FixedK, greedy_reference, make_engine, scaled
from dsd_jax import SamplingParams, SpecConfig
from dsd_jax.compilation import compilation_count
from dsd_jax.drafters import ngram
from dsd_jax.drafters.suffix import lookup, pack_references
from dsd_jax.rollout_memory import RolloutMemory


@pytest.fixture(scope="module")
def target(tiny_pair):
    return scaled(tiny_pair[0], 3.0)


def _lookup(rows, group, banks, K=3, active=None, max_n=2):
    S = max(map(len, rows)) + 4
    tokens = np.zeros((len(rows), S), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    length = np.array([len(r) for r in rows], np.int32)
    active = np.ones(len(rows), bool) if active is None else np.array(active)
    bank = np.stack([pack_references(b, 16) for b in banks])
    return np.asarray(lookup(jnp.asarray(tokens), jnp.asarray(length), jnp.asarray(active),
                             jnp.asarray(np.array(group, np.int32)), jnp.asarray(bank), K, 1, max_n))


def test_longest_match_own_then_siblings_then_references():
    # row 0 ends in "5 6": its own tokens hold "5 6 9", a sibling "5 6 7 8", a reference
    # "5 6 1 2 3": own wins at equal length
    assert _lookup([[5, 6, 9, 1, 5, 6], [4, 5, 6, 7, 8]], [0, 0], [[[5, 6, 1, 2, 3]]] * 2)[0].tolist() \
        == [9, 1, 5]
    # no own match of "3 5 6": the sibling has the longer match (n = 2 over n = 1)
    assert _lookup([[3, 5, 6], [4, 5, 6, 7, 8]], [0, 0], [[], []])[0].tolist() == [7, 8, 6]
    # only the reference continues "3 4": its continuation stops at its separator
    assert _lookup([[1, 3, 4], [9, 9]], [0, 0], [[[3, 4, 8, 2], [7]], []])[0].tolist() == [8, 2, 4]


def test_no_proposals_across_groups_or_from_finished_siblings():
    rows = [[3, 5, 6], [4, 5, 6, 7, 8]]
    assert _lookup(rows, [0, 1], [[], []])[0].tolist() == [6, 6, 6]  # other group: no match
    assert _lookup(rows, [0, 0], [[], []], active=[True, False])[0].tolist() == [6, 6, 6]
    assert _lookup(rows, [-1, -1], [[], []])[0].tolist() == [6, 6, 6]  # no group: own only


def test_bank_keeps_the_newest_references():
    row = pack_references([[1, 2, 3], [4, 5]], 5)
    assert row.tolist() == [3, -1, 4, 5, -1]  # the tail: the newest whole, the oldest cut


def test_rollout_memory_is_bounded():
    m = RolloutMemory(max_prompts=2, per_prompt=2)
    for c in ([1], [2], [3]):
        m.add([9], c)
    assert m.references([9]) == [[2], [3]]
    m.add([8], [4])
    m.add([7], [5])  # evicts the least recently used prompt: [9]
    assert m.references([9]) == [] and m.references([7]) == [[5]] and len(m) == 2
    with pytest.raises(ValueError, match="per_prompt"):
        RolloutMemory(per_prompt=0)


def test_rollout_memory_takes_numpy_completions():
    """A rollout's tokens are numpy arrays: `not completion` raised on two or more tokens and
    dropped a lone token 0 as empty."""
    m = RolloutMemory()
    m.add(np.array([9, 8]), np.array([0], np.int32))
    m.add([9, 8], np.array([5, 6, 7]))
    m.add([9, 8], np.array([], np.int32))  # empty: skipped
    assert m.references([9, 8]) == [[0], [5, 6, 7]]


@pytest.mark.parametrize("bad", [None, float("inf"), float("nan"), "8", True, 2.5, 2.0, 0])
def test_rollout_memory_sizes_must_be_positive_integers(bad):
    for name in ("max_prompts", "per_prompt"):
        with pytest.raises(ValueError, match=rf"{name} must be an integer >= 1, got {re.escape(repr(bad))}"):
            RolloutMemory(**{name: bad})
    assert RolloutMemory(max_prompts=np.int64(3), per_prompt=np.int32(2)).max_prompts == 3


def test_lookups_skip_n_grams_longer_than_the_buffer():
    # an n-gram longer than the buffer can never match: a max_n far above it proposes what it
    # did before (values from the uncapped loop) and traces no more than the largest useful n
    toks = jnp.asarray(np.array([[1, 2, 3, 1, 2, 3], [4, 5, 4, 5, 0, 0], [7] * 6, [9, 0, 0, 0, 0, 0]], np.int32))
    length = jnp.asarray(np.array([6, 4, 6, 1], np.int32))
    assert ngram.lookup(toks, length, 3, 1, 40).tolist() == [[1, 2, 3], [4, 5, 5], [7, 7, 7], [9, 9, 9]]
    size = lambda max_n: len(jax.make_jaxpr(lambda t, n: ngram.lookup(t, n, 3, 1, max_n))(toks, length).eqns)
    assert size(40) == size(5)

    rows = [[5, 6, 9, 1, 5, 6], [4, 5, 6, 7, 8], [1, 2, 3]]
    banks = [[[5, 6, 1, 2, 3]], [], [[1, 2, 3, 4, 5]]]
    assert _lookup(rows, [0, 0, 1], banks, max_n=40).tolist() == [[9, 1, 5], [8, 8, 8], [4, 5, 3]]
    # a full row (n = S) still matches in a longer bank
    args = [jnp.asarray(np.array(a, np.int32)) for a in ([[1, 2, 3]], [3], [1], [0])]
    bank = jnp.asarray(pack_references([[1, 2, 3, 4, 5]], 16)[None])
    assert lookup(*args[:2], args[2].astype(bool), args[3], bank, 3, 1, 40).tolist() == [[4, 5, 3]]
    size = lambda max_n: len(jax.make_jaxpr(
        lambda *a: lookup(*a, 3, 1, max_n))(*args[:2], args[2].astype(bool), args[3], bank).eqns)
    assert size(40) == size(3)


@pytest.fixture(scope="module")
def engine(target):
    # one batch bucket: the warm-up test compiles K = 0..4 once, not per bucket
    return make_engine(target, None, controller=FixedK([0, 4, 1, 4, 2, 0, 4]), method="suffix",
                       max_batch_size=8, max_seq_len=48, batch_buckets=(8,))


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]]


def test_greedy_is_plain_greedy_with_siblings_and_references(engine, target):
    refs = [[[1, 5, 9, 2, 6, 5, 3, 5], [9, 2, 6]], [[8, 2, 8, 1, 8]]]
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, n=3),
                           references=refs)
    for o in outs:
        assert o.token_ids == greedy_reference(target, PROMPTS[o.prompt_index], 20)
    assert engine.stats.to_dict()["acceptance_per_position"][0] > 0  # drafts were accepted


def test_drafter_invariant_sampling_is_plain_sampling(target):
    e = make_engine(target, None, controller=FixedK([3, 0, 4]), method="suffix",
                    acceptance="drafter_invariant", max_batch_size=8, max_seq_len=48)
    plain = make_engine(target, None, method="none", num_speculative_tokens=0, max_seq_len=48,
                        max_batch_size=8)
    sp = SamplingParams(temperature=1.0, max_tokens=16, seed=4, n=3)
    memory = RolloutMemory()
    first = e.generate(PROMPTS, sp, memory=memory)  # the second call drafts from these too
    second = e.generate(PROMPTS, sp, memory=memory)
    ref = [o.token_ids for o in plain.generate(PROMPTS, sp)]
    assert [o.token_ids for o in first] == ref == [o.token_ids for o in second]
    assert len(memory.references(PROMPTS[0])) == 6


def test_no_compilation_after_warmup(engine):
    engine.warmup()
    before = compilation_count()
    engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=8, n=4),
                    references=[[[1, 2, 3]], []])
    engine.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=8))
    assert compilation_count() == before


def test_config_and_reference_errors(engine):
    with pytest.raises(ValueError, match="suffix_bank_len"):
        SpecConfig(method="suffix", suffix_bank_len=0)
    with pytest.raises(ValueError, match="references for 1 prompts"):
        engine.generate(PROMPTS, references=[[]])
    with pytest.raises(ValueError, match="reference 0 of prompt 0 has token ids outside"):
        engine.generate(PROMPTS, references=[[[10 ** 6]], []])


def test_stream_takes_references_and_memory_as_generate_does(engine):
    """stream() had no references=/memory=: a suffix rollout streamed could not draft from
    past completions nor store its own. The memory stores them once the stream is
    exhausted; a stream closed early stores nothing."""
    sp = SamplingParams(temperature=0.0, max_tokens=12, n=2)
    refs = [[[1, 5, 9, 2, 6, 5, 3, 5]], [[8, 2, 8, 1, 8]]]
    want = [o.token_ids for o in engine.generate(PROMPTS, sp, references=refs)]
    joined = [[] for _ in want]
    memory = RolloutMemory()
    for i, new in engine.stream(PROMPTS, sp, references=refs, memory=memory):
        joined[i] += new
    assert joined == want
    assert [list(r) for r in memory.references(PROMPTS[1])] == want[2:]
    untouched = RolloutMemory()
    stream = engine.stream(PROMPTS, sp, memory=untouched)
    next(stream)
    stream.close()
    assert untouched.references(PROMPTS[0]) == []
