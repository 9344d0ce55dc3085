"""vLLM's `logprobs=N`: each completion token's N likeliest raw logprobs at its position,
and the chosen token's, checked against fresh full-sequence forwards."""

import numpy as np
import pytest

from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.step import MAX_ROUNDS
from conftest import FixedK, oracle_logits

N = 5
PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13]]


def _engine(pair, max_logprobs, schedule=(0, 3, 1, 4, 2)):
    target, draft = pair
    return SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=4),
                      max_batch_size=4, max_seq_len=64, prefill_chunk=16, max_logprobs=max_logprobs,
                      controller=FixedK(list(schedule)))


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return _engine(tiny_pair, N)


def _log_softmax(logits):
    shifted = logits.astype(np.float64) - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def test_top_logprobs_are_the_targets_raw_log_softmax(engine, tiny_pair):
    """Per token, through K = 0..4 rounds: the N likeliest ids of log_softmax of the target's
    raw logits at its position, largest first, then the token itself when it is not among
    them, its value its raw logprob; the sampling settings (temperature, top_k) do not
    change them. Sampled at temperature 1 over 64 ids, some tokens fall outside the top N."""
    target = tiny_pair[0]
    sampling = [SamplingParams(temperature=1.0, max_tokens=12, seed=s, logprobs=N) for s in range(2)]
    sampling.append(SamplingParams(temperature=0.7, top_k=3, max_tokens=12, seed=5, logprobs=N))
    outs = engine.generate(PROMPTS, sampling, return_logprobs=True)
    outside = 0
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.top_logprobs) == len(out.token_ids) == 12
        for t, (token, entry) in enumerate(zip(out.token_ids, out.top_logprobs)):
            want = _log_softmax(oracle_logits(target, prompt + out.token_ids[:t]))
            ids = list(entry)
            np.testing.assert_array_equal(ids[:N], np.argsort(-want, kind="stable")[:N])
            np.testing.assert_allclose([entry[i] for i in ids], want[ids], rtol=0, atol=2e-5)
            assert entry[token] == pytest.approx(out.raw_logprobs[t], abs=1e-6)
            assert len(ids) == (N if token in ids[:N] else N + 1)
            outside += token not in ids[:N]
    assert outside > 0  # the chosen token's own entry was exercised


def test_logprobs_none_and_zero_and_a_dropped_stop_token(engine):
    """logprobs=None gives no entries; 0 gives the chosen token's alone; a stop token left
    out of the tokens (include_stop_token=False) takes its entry with it."""
    greedy = dict(temperature=0.0, max_tokens=10)
    plain = engine.generate(PROMPTS[:1], SamplingParams(**greedy))[0]
    assert plain.top_logprobs is None
    stop = plain.token_ids[3]
    outs = engine.generate(PROMPTS[:1] * 2, [
        SamplingParams(**greedy, logprobs=0),
        SamplingParams(**greedy, logprobs=2, stop_token_ids=[stop], include_stop_token=False)],
        return_logprobs=True)
    zero, stopped = outs
    assert [list(e) for e in zero.top_logprobs] == [[t] for t in zero.token_ids]
    assert [e[t] for e, t in zip(zero.top_logprobs, zero.token_ids)] == zero.raw_logprobs
    cut = plain.token_ids.index(stop)
    assert stopped.token_ids == plain.token_ids[:cut] and stopped.finish_reason == "stop"
    assert len(stopped.top_logprobs) == cut
    assert all(list(e)[0] == t for e, t in zip(stopped.top_logprobs, stopped.token_ids))  # greedy: the top


def test_more_than_the_engine_computes_is_refused_before_anything_runs(tiny_pair):
    engine = _engine(tiny_pair, 0, schedule=(2,))
    with pytest.raises(ValueError, match=r"request 1: logprobs=1 .*max_logprobs=0.*max_logprobs=1"):
        engine.generate([[1], [2]], [SamplingParams(max_tokens=3), SamplingParams(max_tokens=3, logprobs=1)])
    assert len(engine.generate([[1]], SamplingParams(max_tokens=3))[0].token_ids) == 3  # still serves
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="logprobs"):
            SamplingParams(logprobs=bad)
    with pytest.raises(ValueError, match=r"max_logprobs must be an integer in \[0, 64\]"):
        _engine(tiny_pair, 65)


def test_an_engine_without_logprobs_reads_back_no_wider_outputs(tiny_pair, engine):
    """max_logprobs=0 (the default) computes no top-k: its step programs return the outputs
    they returned before top logprobs existed, [rounds, bucket, 3 (K+1) + 5]."""
    plain = _engine(tiny_pair, 0)
    for eng, n in ((plain, 0), (engine, N)):
        for k in (0, 2):
            (shape,) = {o.shape for o in eng.programs.step(k, 2).out_info[1:]}
            assert shape == (MAX_ROUNDS, 2, (3 + 2 * n) * (k + 1) + 5)
