"""Greedy speculative decoding is token-identical to plain greedy decoding."""

import numpy as np
import pytest

from dsd_jax import SamplingParams
from dsd_jax.compilation import compilation_count
from conftest import FixedK, greedy_reference, make_engine, scaled

PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24],
           [3, 3, 3, 3, 9, 3, 3, 3]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=14)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    target, draft = tiny_pair
    return scaled(target, 3.0), draft


@pytest.fixture(scope="module")
def reference(pair):
    return [greedy_reference(pair[0], p, GREEDY.max_tokens) for p in PROMPTS]


@pytest.fixture(scope="module")
def draft_engine(pair):
    return make_engine(*pair, method="draft_model")


@pytest.fixture(scope="module")
def ngram_engine(pair):
    return make_engine(pair[0], None, method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.mark.parametrize("schedule", [[1], [2], [3], [4], [0, 3, 0, 0, 4, 1, 2, 0, 0, 0, 4]])
@pytest.mark.parametrize("which", ["draft", "ngram"])
def test_greedy_matches_plain_decoding(which, schedule, draft_engine, ngram_engine, reference):
    engine = draft_engine if which == "draft" else ngram_engine
    engine.controller = FixedK(schedule)
    outs = engine.generate(PROMPTS, GREEDY)
    for out, ref in zip(outs, reference):
        assert out.token_ids == ref
        assert out.finish_reason == "length"


def test_greedy_batches_take_a_shortcut_to_the_same_tokens_and_logprobs(draft_engine):
    """A batch whose live rows are all greedy and unfiltered skips the sampling machinery
    (`step.spec_step`'s shortcut); one sampled row sends the whole batch the exact way.
    The greedy rows' tokens, logprobs and raw logprobs are the same either way, at K = 0
    and through rejection sampling at K > 0."""
    schedule = [0, 3, 1, 0, 2, 4]
    draft_engine.controller = FixedK(schedule)
    alone = draft_engine.generate(PROMPTS[:3], GREEDY, return_logprobs=True)
    draft_engine.controller = FixedK(schedule)
    sampled = SamplingParams(temperature=1.0, max_tokens=GREEDY.max_tokens, seed=3)
    mixed = draft_engine.generate(PROMPTS, [GREEDY] * 3 + [sampled], return_logprobs=True)
    for a, m in zip(alone, mixed):
        assert a.token_ids == m.token_ids
        np.testing.assert_allclose(a.logprobs, m.logprobs, rtol=0, atol=1e-5)
        np.testing.assert_allclose(a.raw_logprobs, m.raw_logprobs, rtol=0, atol=1e-5)
        assert a.logprobs == a.raw_logprobs  # greedy and unfiltered: one distribution


def test_identical_draft_accepts_everything(pair):
    target = pair[0]
    for k in (1, 3, 4):
        ctl = FixedK([k])
        engine = make_engine(target, target, controller=ctl, method="draft_model")
        outs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40))
        # every round accepts all K drafts (until a request hits its length limit)
        for k_used, accepted in ctl.observed:
            assert (accepted == k_used).all()
        assert outs[0].token_ids == greedy_reference(target, PROMPTS[0], 40)


def test_random_draft_low_acceptance_still_identical(pair, reference):
    target, _ = pair
    from dsd_jax import models
    from conftest import tiny_config
    unrelated = scaled(models.init_model(tiny_config(num_layers=1), seed=123), 3.0)
    ctl = FixedK([4])
    engine = make_engine(target, unrelated, controller=ctl, method="draft_model")
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    rate = np.mean([a.mean() for _, a in ctl.observed]) / 4
    assert rate < 0.5


def test_stop_tokens_and_lengths(draft_engine, reference):
    draft_engine.controller = FixedK([3])
    stop = reference[0][4]
    outs = draft_engine.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=14,
                                                             stop_token_ids=[stop]))
    first = reference[0].index(stop)
    assert outs[0].token_ids == reference[0][:first + 1]
    assert outs[0].finish_reason == "stop"
    outs = draft_engine.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=14,
                                                             stop_token_ids=[stop],
                                                             include_stop_token=False))
    assert outs[0].token_ids == reference[0][:first]


def test_max_seq_len_finishes_with_length_and_isolates_slots(pair):
    target, draft = pair
    engine = make_engine(target, draft, controller=FixedK([4]), method="draft_model", max_seq_len=24)
    prompts = [[1, 2, 3], list(range(1, 21)), [4, 5]]
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=100))
    for prompt, out in zip(prompts, outs):
        assert len(prompt) + len(out.token_ids) == 24
        assert out.finish_reason == "length"
        # the neighbours' long verify windows never overwrote this slot's tokens
        assert out.token_ids == greedy_reference(target, prompt, 24 - len(prompt))


def test_no_compilation_after_warmup(pair):
    target, draft = pair
    ctl = FixedK([0, 4, 2, 0, 1, 3])
    engine = make_engine(target, draft, controller=ctl, method="draft_model")
    engine.warmup()
    before = compilation_count()
    for n in (1, 4, 2, 7):  # batch size changes; 7 > slots queues
        engine.generate([[1 + i, 2, 3] for i in range(n)], SamplingParams(temperature=0.0, max_tokens=9))
    engine.set_params(target=scaled(target, 1.01))  # new weights, same shapes
    engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=9))
    assert compilation_count() == before
