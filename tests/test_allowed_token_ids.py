"""vLLM's allowed_token_ids: every id outside a row's list gets probability 0, before
everything else, in the target's law and the drafter's. Greedy output equals a
full-forward reference; sampled output is distributed exactly as the restricted law."""

import jax.numpy as jnp
import numpy as np
import pytest

from dsd_jax import SamplingParams, sampling
from conftest import FixedK, make_engine, oracle_logits, scaled
from test_bad_words import Words
from test_penalties import PROMPTS, penalised_greedy, reference_penalised
from test_spec_sampling import (PROMPT, VOCAB, empirical_joint, exact_joint,  # noqa: F401
                                small_vocab_pair, tv_threshold)  # small_vocab_pair: a fixture


def test_allowed_token_ids_are_checked_and_normalised():
    sp = SamplingParams(allowed_token_ids=[5, np.int64(3), 5])
    assert sp.allowed_token_ids == (5, 3) and SamplingParams().allowed_token_ids is None
    assert sampling.allowed_array(sp.allowed_token_ids)[:3].tolist() == [5, 3, -1]
    assert (sampling.allowed_array(None) == -1).all()
    for bad, why in [([], "allowed_token_ids is empty"), ([1, -2], r"allowed_token_ids\[1\] must be >= 0"),
                     ([1.5], r"allowed_token_ids\[0\] must be an integer"),
                     (range(sampling.MAX_ALLOWED_TOKEN_IDS + 1), "at most 4096")]:
        with pytest.raises(ValueError, match=why):
            SamplingParams(allowed_token_ids=bad)


def test_allowed_logits_keep_each_rows_list():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 2, 6)).astype(np.float32))
    ids = jnp.array([[4, 1, -1], [-1, -1, -1], [0, -1, -1]])
    out = np.asarray(sampling.allowed_logits(logits, ids, jnp.array([True, True, False])))
    keep = np.array([[0, 1, 0, 0, 1, 0], [1] * 6, [1, 0, 0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(out, np.where(keep[:, None, :], np.asarray(logits), -np.inf))
    # no live row has a list: unchanged (the mask is not built)
    same = sampling.allowed_logits(logits, ids, jnp.array([False, True, False]))
    np.testing.assert_array_equal(np.asarray(same), np.asarray(logits))


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return scaled(tiny_pair[0], 3.0), tiny_pair[1]


def restricted_greedy(model, prompt, max_tokens, allowed, logit_bias=None) -> list[int]:
    """Greedy decoding by full forwards: the allow-list first, then the bias."""
    out = []
    for _ in range(max_tokens):
        z = reference_penalised(oracle_logits(model, list(prompt) + out), prompt, out, logit_bias=logit_bias)
        keep = np.zeros_like(z, bool)
        keep[list(allowed)] = True
        out.append(int(np.argmax(np.where(keep, z, -np.inf))))
    return out


def test_greedy_with_allowed_token_ids_equals_the_full_forward_reference(pair):
    """Allow-lists that leave out each row's free choices (one row has none; two are biased
    towards ids they do not allow, which stay at probability 0); rows finish at different
    steps, so a restricted row moves into the free row's slot. A row with only its list,
    run alone, shows the all-greedy shortcut sees lists. Plain decoding
    and the speculative schedules give the reference, and a draft model identical to the
    target has every draft accepted (its proposals are restricted alike)."""
    target, draft = pair
    free = [penalised_greedy(target, p, 6) for p in PROMPTS]
    allowed = [[t for t in range(64) if t % 3 and t not in free[0][:3]], None, [free[2][1], 7, 9, 33],
               [t for t in range(0, 64, 2) if t != free[3][0]]]
    outside = [min(set(range(64)) - set(a)) if a else None for a in allowed]
    biases = [None, None, {outside[2]: 50.0}, {outside[3]: 50.0}]  # ids the rows do not allow
    lengths = [16, 7, 12, 9]
    expected = [restricted_greedy(target, p, m, a if a else range(64), b)
                for p, m, a, b in zip(PROMPTS, lengths, allowed, biases)]
    assert [e[:6] != f for e, f in zip(expected, free)] == [True, False, True, True]
    # row 0 has nothing but its list, and its raw argmax is not allowed at its first
    # positions: run alone, the all-greedy shortcut must not take that argmax
    raw = [int(np.argmax(oracle_logits(target, PROMPTS[0] + expected[0][:j]))) for j in range(3)]
    assert any(t not in allowed[0] for t in raw)
    params = [SamplingParams(temperature=0.0, max_tokens=m, allowed_token_ids=a, logit_bias=b)
              for m, a, b in zip(lengths, allowed, biases)]
    engine = make_engine(target, draft, method="draft_model", batch_buckets=(4,))
    for schedule in ([0], [4], [0, 3, 1, 4, 2]):
        engine.controller = FixedK(schedule)
        assert [o.token_ids for o in engine.generate(PROMPTS, params)] == expected, schedule
    assert engine.generate([PROMPTS[0]], params[0])[0].token_ids == expected[0]
    ctl = FixedK([4])
    itself = make_engine(target, target, controller=ctl, method="draft_model", batch_buckets=(4,))
    assert [o.token_ids for o in itself.generate(PROMPTS, params)] == expected
    assert all((accepted == k).all() for k, accepted in ctl.observed)


def test_the_engine_refuses_lists_outside_the_vocabulary_or_with_nothing_to_draw(pair):
    target, draft = pair
    engine = make_engine(target, draft, method="draft_model", batch_buckets=(4,),
                         tokenizer=Words({"x": [3], " x": [4], "yz": [5, 6], " yz": [7, 6],
                                          "yy": [5, 5], " yy": [5, 5]}))
    cases = [(SamplingParams(allowed_token_ids=[3, 64]),
              r"request 1: allowed_token_ids has token id 64, outside the vocabulary \[0, 64\)"),
             (SamplingParams(allowed_token_ids=[3, 4], bad_words=["x"]),
              r"request 1: allowed_token_ids \[3, 4\] leaves no token to draw first: each is a one-token bad "
              "word$"),
             (SamplingParams(allowed_token_ids=[3, 9], bad_words=["x"], min_tokens=2, stop_token_ids=[9]),
              "each is a one-token bad word or a stop id min_tokens bans"),
             # later positions too (`dead_ends`): 3 is always banned, 5 after 5
             (SamplingParams(allowed_token_ids=[3, 5], bad_words=["x", "yy"], max_tokens=4),
              r"request 1: allowed_token_ids \[3, 5\] leaves no token to draw at completion token 2 after one "
              r"ending in \[5\]: each is banned by a bad word there$"),
             (SamplingParams(allowed_token_ids=[5, 9], bad_words=["yy"], min_tokens=3, stop_token_ids=[9]),
              r"at completion token 2 after one ending in \[5\]: each is banned by a bad word there or a stop id "
              "min_tokens bans$")]
    for sp, why in cases:
        with pytest.raises(ValueError, match=why):
            engine.generate(PROMPTS[:2], [SamplingParams(), sp])
    # a two-token bad word bans its last id only after the first: something is left to draw;
    # one token only, or a stop id left to end on after 5: nothing gets stuck
    out = engine.generate(PROMPTS[:3], [
        SamplingParams(max_tokens=2, allowed_token_ids=[6], bad_words=["yz"]),
        SamplingParams(allowed_token_ids=[3, 5], bad_words=["x", "yy"], max_tokens=1),
        SamplingParams(allowed_token_ids=[5, 9], bad_words=["yy"], stop_token_ids=[9], max_tokens=4, seed=3)])
    assert out[1].token_ids == [5]
    assert set(out[2].token_ids) <= {5, 9} and [5, 5] not in [out[2].token_ids[j:j + 2] for j in range(3)]


def _restricted_joint(model, sp: SamplingParams, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2 | prompt) with the ids outside sp.allowed_token_ids at -inf, then
    temperature, by enumeration in numpy float64."""
    def law(seq):
        z = np.full(VOCAB, -np.inf)
        keep = list(sp.allowed_token_ids)
        z[keep] = np.array(oracle_logits(model, seq), np.float64)[keep] / sp.temperature
        p = np.exp(z - z.max())
        return p / p.sum()
    p1 = law(prompt)
    return np.stack([p1[a] * law(list(prompt) + [a]) for a in range(VOCAB)])


def test_sampled_output_is_the_restricted_law_exactly(small_vocab_pair):
    """The joint law of two tokens matches the restricted one (the two likeliest first
    tokens left out of five allowed), with power against the plain law."""
    target, draft = small_vocab_pair
    order = np.argsort(oracle_logits(target, PROMPT))
    sp = SamplingParams(temperature=1.0, max_tokens=2, allowed_token_ids=sorted(order[:5].tolist()))
    engine = make_engine(target, draft, method="draft_model", draft_sampling="sample", max_batch_size=64,
                         batch_buckets=(64,), controller=FixedK([4]))
    n = 2000
    outs = engine.generate([PROMPT] * n, [SamplingParams(**{**sp.__dict__, "seed": 8000 + i})
                                          for i in range(n)])
    exact = _restricted_joint(target, sp)
    threshold = tv_threshold(exact, n)
    assert 0.5 * np.abs(empirical_joint(outs) - exact).sum() < threshold
    plain = exact_joint(target, SamplingParams(temperature=1.0, max_tokens=2))
    assert 0.5 * np.abs(plain - exact).sum() > 2 * threshold
