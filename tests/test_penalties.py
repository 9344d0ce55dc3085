"""vLLM's repetition, presence and frequency penalties: the target's law at each position
is the penalised law given everything before it (the drafts of the same round included).
Greedy output equals plain decoding and a full-forward reference; sampled output is
distributed exactly as the penalised law (drafter-invariant output:
`test_drafter_invariant_settings.py`)."""

import collections
import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from dsd_jax import SamplingParams, penalties
from conftest import FixedK, make_engine, oracle_logits, scaled
from test_spec_sampling import (PROMPT, VOCAB, empirical_joint, exact_joint,  # noqa: F401
                                small_vocab_pair, tv_threshold)  # small_vocab_pair: a fixture

PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10], [3, 3, 3, 9]]
PENALTIES = [dict(frequency_penalty=1.5), dict(),  # an unpenalised row beside the others
             dict(presence_penalty=2.0, repetition_penalty=0.7),
             dict(frequency_penalty=-0.5, presence_penalty=1.0, repetition_penalty=1.8)]


def reference_penalised(logits, prompt, completion, repetition_penalty=1.0, presence_penalty=0.0,
                        frequency_penalty=0.0, logit_bias=None) -> np.ndarray:
    """vLLM's logit_bias, then its penalties, on one position's float32 logits, token by
    token in numpy."""
    z = np.array(logits, np.float32)
    for t, bias in (logit_bias or {}).items():
        z[t] += np.float32(bias)
    for t in set(prompt) | set(completion):
        z[t] *= np.float32(1.0 / repetition_penalty) if z[t] > 0 else np.float32(repetition_penalty)
    for t, c in collections.Counter(completion).items():
        z[t] -= np.float32(frequency_penalty) * np.float32(c)
        z[t] -= np.float32(presence_penalty)
    return z


def penalised_greedy(model, prompt, max_tokens, **settings) -> list[int]:
    """Greedy decoding by full forwards, each position's logits penalised."""
    out = []
    for _ in range(max_tokens):
        z = reference_penalised(oracle_logits(model, list(prompt) + out), prompt, out, **settings)
        out.append(int(np.argmax(z)))
    return out


def test_penalty_settings_are_checked():
    sp = SamplingParams(repetition_penalty=np.float32(1.1), presence_penalty=-2, frequency_penalty=2)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (
        pytest.approx(1.1), -2.0, 2.0)
    assert isinstance(sp.presence_penalty, float)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="repetition_penalty must be a finite number > 0"):
            SamplingParams(repetition_penalty=bad)
    for name in ("presence_penalty", "frequency_penalty"):
        for bad in (2.5, -2.01, float("nan")):
            with pytest.raises(ValueError, match=rf"{name} must be in \[-2, 2\]"):
                SamplingParams(**{name: bad})
        with pytest.raises(ValueError, match=f"{name} must be a number"):
            SamplingParams(**{name: "1"})


def test_each_window_position_counts_the_drafts_before_it():
    """Two rows, a window of 3 positions: the prompt's tokens, the committed completion
    and the drafts before each position, against the numpy reference (a banned -inf
    stays -inf)."""
    rng = np.random.default_rng(0)
    V = 12
    tokens = np.array([[1, 2, 2, 5, 7, 7, 7, 0, 0, 0], [3, 4, 4, 4, 9, 9, 0, 0, 0, 0]], np.int32)
    prompt_length, length = np.array([3, 2], np.int32), np.array([7, 6], np.int32)
    drafts = np.array([[7, 11], [4, 1]], np.int32)
    logits = rng.normal(size=(2, 3, V)).astype(np.float32) * 3
    logits[0, 1, 5] = -np.inf
    settings = penalties.Penalties(jnp.array([1.7, 0.6]), jnp.array([0.5, -1.0]), jnp.array([0.25, 2.0]))
    out = np.asarray(penalties.penalised_logits(jnp.asarray(logits), settings, jnp.array([True, True]),
                                                jnp.asarray(tokens), jnp.asarray(prompt_length),
                                                jnp.asarray(length), jnp.asarray(drafts)))
    for b, j in itertools.product(range(2), range(3)):
        prompt = tokens[b, :prompt_length[b]].tolist()
        completion = tokens[b, prompt_length[b]:length[b]].tolist() + drafts[b, :j].tolist()
        expected = reference_penalised(logits[b, j], prompt, completion,
                                       *(float(x[b]) for x in settings))
        np.testing.assert_allclose(out[b, j], expected, rtol=1e-6, atol=1e-6, err_msg=(b, j))
    assert np.isneginf(out[0, 1, 5])
    # a drafter proposing position j with its own d_1..d_j (-1: unused) gets the same logits
    for j in range(3):
        drafted = np.full((2, 3), -1, np.int32)
        drafted[:, :j] = drafts[:, :j]
        own = penalties.penalised_draft_logits(jnp.asarray(logits[:, j]), settings, jnp.array([True, True]),
                                               jnp.asarray(tokens), jnp.asarray(prompt_length),
                                               jnp.asarray(length), jnp.asarray(drafted))
        np.testing.assert_allclose(np.asarray(own), out[:, j], rtol=1e-6, atol=1e-6, err_msg=j)
    # no live row penalises (row 1 is finished): the logits come back as they are
    idle = penalties.Penalties(jnp.array([1.0, 1.7]), jnp.array([0.0, 0.5]), jnp.array([0.0, 0.0]))
    same = penalties.penalised_logits(jnp.asarray(logits), idle, jnp.array([True, False]),
                                      jnp.asarray(tokens), jnp.asarray(prompt_length),
                                      jnp.asarray(length), jnp.asarray(drafts))
    np.testing.assert_array_equal(np.asarray(same), logits)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return scaled(tiny_pair[0], 3.0), tiny_pair[1]


def test_greedy_with_penalties_equals_the_full_forward_reference(pair):
    """Rows penalise differently (one not at all), and each penalised output differs from
    the unpenalised greedy one; plain decoding, every K schedule and both drafters give
    the reference. Rows finish at different steps: the third moves into the unpenalised
    row's slot after 7 tokens, its settings with it. One batch bucket: nothing here
    depends on it (fewer programs)."""
    target, draft = pair
    lengths = [16, 7, 12, 4]
    expected = [penalised_greedy(target, p, m, **s) for p, m, s in zip(PROMPTS, lengths, PENALTIES)]
    assert [e != penalised_greedy(target, p, m) for e, p, m in zip(expected, PROMPTS, lengths)] == [
        True, False, True, True]
    params = [SamplingParams(temperature=0.0, max_tokens=m, **s) for m, s in zip(lengths, PENALTIES)]
    engines = {"draft_model": make_engine(target, draft, method="draft_model", batch_buckets=(4,)),
               "ngram": make_engine(target, None, method="ngram", prompt_lookup_min=1,
                                    prompt_lookup_max=3, batch_buckets=(4,))}
    for (name, engine), schedule in itertools.product(engines.items(), [[0], [4], [0, 3, 1, 4, 2]]):
        if name == "ngram" and schedule != [4]:  # the draft model covers the others
            continue
        engine.controller = FixedK(schedule)
        outs = engine.generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == expected, (name, schedule)


def test_a_draft_equal_to_the_target_is_accepted_whole_under_penalties(pair):
    """The drafter penalises as the target does, each proposal counting the drafts before
    it: a draft model identical to the target proposes the target's own penalised choices
    (greedy rows) and its own penalised law (sampled rows, q = p), so every draft is
    accepted (a drafter blind to the penalties loses drafts here, both ways)."""
    target = pair[0]
    greedy = [SamplingParams(temperature=0.0, max_tokens=12, **s) for s in PENALTIES]
    sampled = [SamplingParams(temperature=1.0, top_k=5, max_tokens=12, seed=40 + i, **s)
               for i, s in enumerate(PENALTIES)]
    ctl = FixedK([4])
    engine = make_engine(target, target, controller=ctl, method="draft_model", draft_sampling="sample",
                         batch_buckets=(4,))
    for params in (greedy, sampled):
        ctl.observed.clear()
        engine.generate(PROMPTS, params)
        assert all((accepted == k).all() for k, accepted in ctl.observed), params[0]


def _penalised_joint(model, sp: SamplingParams, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2 | prompt) under the penalised law, by enumeration in numpy float64:
    the penalties, then temperature and top-k."""
    settings = dict(repetition_penalty=sp.repetition_penalty, presence_penalty=sp.presence_penalty,
                    frequency_penalty=sp.frequency_penalty)

    def law(completion):
        z = reference_penalised(oracle_logits(model, list(prompt) + completion), prompt, completion,
                                **settings).astype(np.float64) / sp.temperature
        if sp.top_k:
            z[z < np.sort(z)[-sp.top_k]] = -np.inf
        p = np.exp(z - z.max())
        return p / p.sum()
    p1 = law([])
    return np.stack([p1[a] * law([a]) for a in range(VOCAB)])


def test_sampled_output_is_the_penalised_law_exactly(small_vocab_pair):
    """The joint law of two tokens matches the penalised one (the prompt's tokens at the
    first, the first token as well at the second), with power against the plain law."""
    target, draft = small_vocab_pair
    engine = make_engine(target, draft, method="draft_model", draft_sampling="sample",
                         max_batch_size=64, batch_buckets=(64,))
    n = 2000
    for sp, k in [(SamplingParams(temperature=1.0, max_tokens=2, repetition_penalty=3.0,
                                  presence_penalty=1.5), 1),
                  (SamplingParams(temperature=0.8, top_k=4, max_tokens=2, repetition_penalty=0.5,
                                  frequency_penalty=2.0), 4)]:
        engine.controller = FixedK([k])
        params = [SamplingParams(**{**sp.__dict__, "seed": 9000 * k + i}) for i in range(n)]
        outs = engine.generate([PROMPT] * n, params)
        exact = _penalised_joint(target, sp)
        threshold = tv_threshold(exact, n)
        assert 0.5 * np.abs(empirical_joint(outs) - exact).sum() < threshold, (sp, k)
        plain = exact_joint(target, SamplingParams(temperature=sp.temperature, top_k=sp.top_k,
                                                   max_tokens=2))
        assert 0.5 * np.abs(plain - exact).sum() > 2 * threshold


def test_greedy_shortcut_gives_what_the_exact_path_gives(pair):
    """An all-greedy batch that bans (min_tokens), biases or penalises takes a shortcut without
    temperature or noise; a sampled row beside the same requests sends every round down
    the exact path. The greedy rows' tokens and logprobs are the same both ways."""
    from conftest import greedy_reference
    target, draft = pair
    free = greedy_reference(target, PROMPTS[1], 3)
    greedy = [SamplingParams(temperature=0.0, max_tokens=10, **PENALTIES[3]),
              SamplingParams(temperature=0.0, max_tokens=10, min_tokens=6, stop_token_ids=free[:2],
                             logit_bias={free[2]: -30.0, 17: 4.5})]
    engine = make_engine(target, draft, method="draft_model", batch_buckets=(4,),
                         controller=FixedK([3]))
    alone = engine.generate(PROMPTS[:2], greedy, return_logprobs=True)
    mixed = engine.generate(PROMPTS[:3], greedy + [SamplingParams(temperature=1.0, max_tokens=10, seed=5)],
                            return_logprobs=True)
    assert alone[1].token_ids[:3] != free[:3]  # the ban and the bias changed the tokens
    for a, m in zip(alone, mixed):
        assert a.token_ids == m.token_ids
        np.testing.assert_allclose(a.logprobs, m.logprobs, rtol=1e-6, atol=1e-7)
