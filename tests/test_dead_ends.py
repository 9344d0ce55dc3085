"""A request whose allowed_token_ids, bad words and min_tokens can ban every id at some
position is refused up front (`dsd_jax.dead_ends`), not sampled from all -inf (NaN
logprobs and a banned id: engine_fuzz.py, seed 7524). The search is checked against
every completion enumerated under vLLM's ban rule; the engine's refusal while it
generates is in test_allowed_token_ids.py."""

import pytest
from hypothesis import given, settings, strategies as st

from dsd_jax import SamplingParams
from dsd_jax.dead_ends import first_stuck
from conftest import make_engine
from test_bad_words import Words, vllm_bans


def stuck_by_enumeration(sequences, allowed, vocab, stop_ids, min_tokens, room):
    """Every completion the constraints allow, position by position: the first position
    (below room) at which one has no id left, with those completions; None if none."""
    pool = set(range(vocab)) if allowed is None else set(allowed)
    live = [()]
    for position in range(room):
        following, stuck = [], []
        for past in live:
            ids = pool - vllm_bans(sequences, past) - (set(stop_ids) if position < min_tokens else set())
            if not ids:
                stuck.append(past)
            following += [past + (t,) for t in sorted(ids - set(stop_ids))]  # a stop id ends it
        if stuck:
            return position, stuck
        live = following
    return None


@settings(max_examples=300, deadline=None)
@given(vocab=st.integers(2, 5), data=st.data())
def test_the_search_finds_the_first_stuck_position_every_completion_could_reach(vocab, data):
    token = st.integers(0, vocab - 1)
    sequences = data.draw(st.lists(st.lists(token, min_size=1, max_size=3).map(tuple), max_size=5))
    allowed = data.draw(st.none() | st.lists(token, min_size=1, max_size=vocab, unique=True))
    stop_ids = data.draw(st.lists(token, max_size=2, unique=True))
    min_tokens, room = data.draw(st.integers(0, 5)), data.draw(st.integers(1, 6))

    found = first_stuck(tuple(sequences), None if allowed is None else tuple(allowed), vocab, tuple(stop_ids),
                        min_tokens)
    expected = stuck_by_enumeration(sequences, allowed, vocab, stop_ids, min_tokens, room)
    if expected is None:
        assert found is None or found[0] >= room
        return
    position, stuck = expected
    assert found is not None and found[0] == position
    assert any(past[len(past) - len(found[1]):] == found[1] for past in stuck), (found, stuck)


def test_stop_ids_end_a_completion_and_min_tokens_bans_them():
    # allowed a, b with "b b" banned: after b only a is left, a stop id: it ends there,
    # unless min_tokens still bans it
    assert first_stuck(((1, 1),), (0, 1), 8, (0,), 1) is None
    assert first_stuck(((1, 1),), (0, 1), 8, (0,), 2) == (1, (1,))
    # b and c alternate while min_tokens bans the stop id a, then may stop: each state is
    # searched once, not each position of a long ban
    assert first_stuck(((1, 1), (2, 2)), (0, 1, 2), 8, (0,), 10**9) is None
    # "b c" banned too: after b nothing is left
    assert first_stuck(((1, 1), (2, 2), (1, 2)), (1, 2), 8, (), 0) == (1, (1,))
    # the whole vocabulary: one that small can be banned outright by one-token bad words
    assert first_stuck(((0,), (1,)), None, 2, (), 0) == (0, ())
    assert first_stuck(((0,), (1,)), None, 3, (), 0) is None


def test_check_refuses_what_generate_would_before_anything_compiles(tiny_pair):
    target, draft = tiny_pair
    engine = make_engine(target, draft, method="draft_model", tokenizer=Words({"x": [3], " x": [3], "yy": [5, 5],
                                                                             " yy": [5, 5]}))
    stuck = SamplingParams(allowed_token_ids=[3, 5], bad_words=["x", "yy"], max_tokens=4)
    with pytest.raises(ValueError, match=r"request 0: .* no token to draw at completion token 2 after one ending in \[5\]"):
        engine.check([[1, 2]], stuck)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.check([[1, 2], []], SamplingParams())
    engine.check([[1, 2]], SamplingParams(allowed_token_ids=[3, 5], bad_words=["x", "yy"], max_tokens=1))
    assert engine.programs.compile_s == 0  # (`dsd-jax generate` checks before its warm-up)
