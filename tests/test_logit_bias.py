"""vLLM's (and OpenAI's) logit_bias: each listed token's bias is added to the target's raw
logits before the penalties, temperature and the filters, on every path. Greedy output
equals plain decoding and a full-forward reference; sampled output is distributed
exactly as the biased law (drafter-invariant output: `test_drafter_invariant_settings.py`)."""


import numpy as np
import pytest

from dsd_jax import SamplingParams, sampling
from conftest import FixedK, make_engine, oracle_logits, scaled
from test_penalties import PROMPTS, penalised_greedy
from test_spec_sampling import (PROMPT, VOCAB, empirical_joint, exact_joint,  # noqa: F401
                                small_vocab_pair, tv_threshold)  # small_vocab_pair: a fixture


def test_logit_bias_is_checked_and_normalised():
    sp = SamplingParams(logit_bias={np.int64(9): 2, 3: np.float32(-1.5)})
    assert sp.logit_bias == {3: -1.5, 9: 2.0} and list(sp.logit_bias) == [3, 9]
    assert SamplingParams(logit_bias={}).logit_bias is None and SamplingParams().logit_bias is None
    ids, values = sampling.bias_arrays(sp.logit_bias)
    assert ids[:3].tolist() == [3, 9, -1] and values[:2].tolist() == [-1.5, 2.0]
    for bad, why in [({1: 100.5}, r"logit_bias\[1\] must be in \[-100, 100\]"),
                     ({1: float("nan")}, r"logit_bias\[1\] must be in"),
                     ({"1": 2.0}, "logit_bias token id must be an integer"),
                     ({-1: 2.0}, "logit_bias token id must be >= 0"),
                     ({1: "2"}, r"logit_bias\[1\] must be a number"),
                     ([(1, 2.0)], "logit_bias must be a mapping"),
                     (dict.fromkeys(range(sampling.MAX_LOGIT_BIAS + 1), 1.0), "at most 300")]:
        with pytest.raises(ValueError, match=why):
            SamplingParams(logit_bias=bad)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return scaled(tiny_pair[0], 3.0), tiny_pair[1]


def test_greedy_with_logit_bias_equals_the_full_forward_reference(pair):
    """Biases that move the argmax, one row unbiased, one biased and penalised (the bias
    comes first: the repetition penalty scales the biased logit); rows finish at different
    steps, so a biased row moves into the unbiased row's slot. Plain decoding and the
    speculative schedules give the reference; an id outside the vocabulary is refused."""
    target, draft = pair
    free = [penalised_greedy(target, p, 4) for p in PROMPTS]
    settings = [dict(logit_bias={free[0][0]: -20.0, free[0][1]: -20.0}), {},
                dict(logit_bias={5: 12.0, free[2][0]: -50.0}),
                dict(logit_bias={5: 8.0}, repetition_penalty=1.8, presence_penalty=1.0)]
    lengths = [16, 7, 12, 9]
    expected = [penalised_greedy(target, p, m, **s) for p, m, s in zip(PROMPTS, lengths, settings)]
    assert [e[:4] != f[:len(e[:4])] for e, f in zip(expected, free)] == [True, False, True, True]
    params = [SamplingParams(temperature=0.0, max_tokens=m, **s) for m, s in zip(lengths, settings)]
    engine = make_engine(target, draft, method="draft_model", batch_buckets=(4,))
    for schedule in ([0], [4], [0, 3, 1, 4, 2]):
        engine.controller = FixedK(schedule)
        assert [o.token_ids for o in engine.generate(PROMPTS, params)] == expected, schedule
    with pytest.raises(ValueError, match=r"request 1: logit_bias has token id 64, outside the vocabulary"):
        engine.generate(PROMPTS[:2], [params[0], SamplingParams(logit_bias={3: 1.0, 64: 1.0})])


def _biased_joint(model, sp: SamplingParams, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2 | prompt) with sp.logit_bias added to the logits, then temperature, by
    enumeration in numpy float64."""
    def law(seq):
        z = np.array(oracle_logits(model, seq), np.float64)
        for t, bias in sp.logit_bias.items():
            z[t] += bias
        z /= sp.temperature
        p = np.exp(z - z.max())
        return p / p.sum()
    p1 = law(prompt)
    return np.stack([p1[a] * law(list(prompt) + [a]) for a in range(VOCAB)])


def test_sampled_output_is_the_biased_law_exactly(small_vocab_pair):
    """The joint law of two tokens matches the biased one (the likeliest first token
    pushed down, two others up), with power against the plain law."""
    target, draft = small_vocab_pair
    likeliest = int(np.argmax(oracle_logits(target, PROMPT)))
    sp = SamplingParams(temperature=1.0, max_tokens=2,
                        logit_bias={likeliest: -3.0, (likeliest + 1) % VOCAB: 2.0, (likeliest + 3) % VOCAB: 1.0})
    engine = make_engine(target, draft, method="draft_model", draft_sampling="sample",
                         max_batch_size=64, batch_buckets=(64,), controller=FixedK([2]))
    n = 2000
    outs = engine.generate([PROMPT] * n, [SamplingParams(**{**sp.__dict__, "seed": 4000 + i})
                                          for i in range(n)])
    exact = _biased_joint(target, sp)
    threshold = tv_threshold(exact, n)
    assert 0.5 * np.abs(empirical_joint(outs) - exact).sum() < threshold
    plain = exact_joint(target, SamplingParams(temperature=1.0, max_tokens=2))
    assert 0.5 * np.abs(plain - exact).sum() > 2 * threshold
