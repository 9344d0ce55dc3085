"""vLLM's min_tokens: a completion's first min_tokens tokens are never its stop ids or its
end-of-text ids (they get probability 0 there, before temperature and the filters, in the
target's law and the drafter's), and the law of the rest is unchanged. Sampled output is
distributed exactly as that law; greedy output equals plain decoding (drafter-invariant
output: `test_drafter_invariant_settings.py`)."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from dsd_jax import SamplingParams, sampling
from conftest import FixedK, greedy_reference, make_engine, oracle_logits, scaled
from test_spec_sampling import (PROMPT, VOCAB, empirical_joint, exact_joint,  # noqa: F401
                                small_vocab_pair, tv_threshold)  # small_vocab_pair: a fixture

PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10], [3, 3, 3, 9]]


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return scaled(tiny_pair[0], 3.0), tiny_pair[1]


def test_min_tokens_is_checked():
    assert SamplingParams().min_tokens == 0
    assert SamplingParams(max_tokens=3, min_tokens=np.int64(3)).min_tokens == 3
    with pytest.raises(ValueError, match="min_tokens must be >= 0"):
        SamplingParams(min_tokens=-1)
    with pytest.raises(ValueError, match="min_tokens must be an integer"):
        SamplingParams(min_tokens=2.0)
    with pytest.raises(ValueError, match=r"min_tokens \(5\) must be at most max_tokens \(4\)"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_banned_ids_cover_the_positions_before_min_length_only():
    stop_ids = jnp.array([[4, 9, -1], [2, -1, -1]], jnp.int32)
    positions = jnp.array([[5, 6, 7], [5, 6, 7]], jnp.int32)
    banned = np.asarray(sampling.banned_ids(stop_ids, positions, jnp.array([7, 0], jnp.int32)))
    np.testing.assert_array_equal(banned[0], [[4, 9, -1], [4, 9, -1], [-1, -1, -1]])
    assert (banned[1] == -1).all()
    logits = jnp.zeros((2, 3, 12))
    out = np.asarray(sampling.suppress(logits, jnp.asarray(banned)))
    assert np.isneginf(out[0, :2, [4, 9]]).all() and np.isfinite(out[0, 2]).all()
    assert np.isneginf(out).sum() == 4


def _schedules():
    return [[0], [2], [4], [0, 3, 1, 0, 4, 2]]


def test_greedy_completions_hold_no_stop_id_before_min_tokens(pair):
    """Stop ids the unbanned greedy path would end at at once are skipped while banned,
    the same for plain decoding, every K schedule and both drafters (the end-of-text ids
    too), and equal to a full-forward greedy with the ids at -inf."""
    target, draft = pair
    free = [greedy_reference(target, p, 16) for p in PROMPTS]
    stops = [[f[0], f[2]] for f in free]  # without min_tokens each would stop at its first token
    min_tokens = [5, 3, 8, 1]
    expected = [greedy_reference(target, p, 16, s, m) for p, s, m in zip(PROMPTS, stops, min_tokens)]
    assert all(len(e) > m for e, m in zip(expected, min_tokens))
    assert all(not set(e[:m]) & set(s) for e, s, m in zip(expected, stops, min_tokens))
    params = [SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=s, min_tokens=m)
              for s, m in zip(stops, min_tokens)]
    engines = {"draft_model": make_engine(target, draft, method="draft_model", batch_buckets=(4,)),
               "ngram": make_engine(target, None, method="ngram", prompt_lookup_min=1,
                                    prompt_lookup_max=3, batch_buckets=(4,))}  # one bucket: fewer programs
    for (name, engine), schedule in itertools.product(engines.items(), _schedules()):
        if name == "ngram" and schedule in ([0], [4]):  # the draft model covers those
            continue
        engine.controller = FixedK(schedule)
        outs = engine.generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == expected, (name, schedule)
    # the engine's end-of-text ids are banned as stop ids are; ignore_eos leaves them drawable
    engine = engines["draft_model"]
    engine.controller = FixedK([3])
    engine.eos_token_ids = (free[0][0],)
    eos_params = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=4)
    out = engine.generate([PROMPTS[0]], eos_params)[0]
    assert out.token_ids == greedy_reference(target, PROMPTS[0], 16, [free[0][0]], 4)
    out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=16, min_tokens=4,
                                                       ignore_eos=True))[0]
    assert out.token_ids == free[0]
    # max_tokens None (vLLM's: what the slot holds) with a min_tokens past the slot (2**31
    # overflowed int32 at admission): every stop id banned to the slot's end
    out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=None, min_tokens=2 ** 31,
                                                       stop_token_ids=stops[0]))[0]
    room = engine.max_seq_len - len(PROMPTS[0])
    assert out.finish_reason == "length"
    assert out.token_ids == greedy_reference(target, PROMPTS[0], room, stops[0], room)


def test_a_draft_equal_to_the_target_is_still_accepted_whole(pair):
    """The drafter bans what the target bans: a draft model identical to the target
    proposes the target's own banned-greedy tokens, and every draft is accepted."""
    target = pair[0]
    free = greedy_reference(target, PROMPTS[0], 24)
    stops = list(dict.fromkeys(free[:4]))
    ctl = FixedK([3])
    engine = make_engine(target, target, controller=ctl, method="draft_model")
    out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=24, min_tokens=12,
                                                       stop_token_ids=stops))[0]
    assert out.token_ids == greedy_reference(target, PROMPTS[0], 24, stops, 12)
    assert all((accepted == k).all() for k, accepted in ctl.observed[:3])  # rounds while banned


def _banned_joint(model, sp: SamplingParams, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2 | prompt) with sp.stop_token_ids banned at the first token only
    (min_tokens=1), by enumeration in numpy: -inf, then temperature, then top-k."""
    def law(logits, banned):
        z = np.array(logits, np.float64) / sp.temperature
        z[list(banned)] = -np.inf
        if sp.top_k:
            z[z < np.sort(z)[-sp.top_k]] = -np.inf
        p = np.exp(z - z.max())
        return p / p.sum()
    p1 = law(oracle_logits(model, prompt), sp.stop_token_ids)
    return np.stack([p1[a] * law(oracle_logits(model, list(prompt) + [a]), ()) for a in range(VOCAB)])


def test_sampled_output_is_the_banned_law_exactly(small_vocab_pair):
    """min_tokens=1 bans the two likeliest first tokens and nothing at the second: the
    joint law of two tokens matches that, with power against the unbanned law."""
    target, draft = small_vocab_pair
    likeliest = np.argsort(oracle_logits(target, PROMPT))[::-1][:2].tolist()
    engine = make_engine(target, draft, method="draft_model", draft_sampling="sample",
                         max_batch_size=64, batch_buckets=(64,))
    n = 2000
    for sp, k in [(SamplingParams(temperature=1.0, max_tokens=2, min_tokens=1,
                                  stop_token_ids=likeliest), 1),
                  (SamplingParams(temperature=0.8, top_k=3, max_tokens=2, min_tokens=1,
                                  stop_token_ids=likeliest), 4)]:
        engine.controller = FixedK([k])
        params = [SamplingParams(**{**sp.__dict__, "seed": 7000 * k + i}) for i in range(n)]
        outs = engine.generate([PROMPT] * n, params)
        exact = _banned_joint(target, sp)
        threshold = tv_threshold(exact, n)
        assert 0.5 * np.abs(empirical_joint(outs) - exact).sum() < threshold, (sp, k)
        # power: the unbanned law is far outside the threshold
        unbanned = exact_joint(target, SamplingParams(**{**sp.__dict__, "min_tokens": 0}))
        assert 0.5 * np.abs(unbanned - exact).sum() > 2 * threshold
