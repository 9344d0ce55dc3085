"""Drafter-invariant speculation gives plain sampling's tokens, token for token, under
every request setting that changes the target's law (min_tokens, bad_words,
allowed_token_ids, logit_bias, the penalties), each on its own row beside others; and
each setting changes the output (power). One test for all of them: each engine pair
costs more to build than to run."""

import dataclasses

from dsd_jax import SamplingParams
from conftest import FixedK, make_engine
from test_bad_words import words_for
from test_spec_sampling import small_vocab_pair  # noqa: F401  (a fixture)

# which fields, set to what, turn each setting off
OFF = {"min_tokens": dict(min_tokens=0), "bad_words": dict(bad_words=()),
       "allowed_token_ids": dict(allowed_token_ids=None), "logit_bias": dict(logit_bias=None),
       "penalties": dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)}


def test_drafter_invariant_equals_plain_sampling_under_every_law_changing_setting(small_vocab_pair):
    target, draft = small_vocab_pair
    tokenizer, (one, two, three) = words_for([(2,), (1, 5), (7, 7, 3)])
    prompts = [[1, 5, 2], [3], [2, 2, 7, 1, 2, 2, 7, 1, 2], [4, 4]]
    params = [
        SamplingParams(temperature=1.0, max_tokens=20, seed=21, min_tokens=12, stop_token_ids=[0, 3],
                       bad_words=[two]),
        SamplingParams(temperature=0.7, top_k=4, max_tokens=20, seed=22, min_tokens=6, stop_token_ids=[1],
                       repetition_penalty=1.5, logit_bias={0: 3.0, 4: -2.0}),
        SamplingParams(temperature=1.0, top_p=0.8, max_tokens=20, seed=23, presence_penalty=1.2,
                       frequency_penalty=0.8, bad_words=[one, three], allowed_token_ids=[1, 2, 3, 5, 6, 7]),
        SamplingParams(temperature=1.0, max_tokens=20, seed=24, min_tokens=20, stop_token_ids=[2, 7],
                       allowed_token_ids=[0, 2, 4, 6], logit_bias={7: 5.0, 0: -1.5})]
    plain = make_engine(target, None, method="none", num_speculative_tokens=0, batch_buckets=(4,),
                        tokenizer=tokenizer)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    engine = make_engine(target, draft, method="draft_model", acceptance="drafter_invariant",
                         batch_buckets=(4,), tokenizer=tokenizer)
    for schedule in ([4], [0, 3, 1, 4, 2]):
        engine.controller = FixedK(schedule)
        assert [o.token_ids for o in engine.generate(prompts, params)] == expected, schedule
    assert all(len(e) >= sp.min_tokens for e, sp in zip(expected, params))
    for name, off in OFF.items():  # power: each setting changes some row's tokens
        without = [dataclasses.replace(sp, **off) for sp in params]
        assert [o.token_ids for o in plain.generate(prompts, without)] != expected, name
