"""vLLM's `logprobs=N` and `prompt_logprobs=N`: each completion (or prompt) token's N
likeliest raw logprobs at its position, and its own, checked against fresh full-sequence
forwards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, step
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


def _check_entry(entry, token, want, n):
    """entry: the n likeliest ids of `want` (log_softmax) in order, their values, then the
    token's own when it is not among them."""
    ids = list(entry)
    np.testing.assert_array_equal(ids[:n], np.argsort(-want, kind="stable")[:n])
    np.testing.assert_allclose([entry[i] for i in ids], want[ids], rtol=0, atol=2e-5)
    assert len(ids) == (n if token in ids[:n] else n + 1)


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
            _check_entry(entry, token, _log_softmax(oracle_logits(target, prompt + out.token_ids[:t])), N)
            assert entry[token] == pytest.approx(out.raw_logprobs[t], abs=1e-6)
            outside += len(entry) > N
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


def test_prompt_logprobs_over_several_chunks(engine, tiny_pair):
    """prompt_logprobs=3: None for the first token, then each prompt token's entry, across
    prefill chunks (16 tokens here: a 41-token prompt takes three); a 1-token prompt gets
    [None]; a request beside them asking for none gets None; the completions are those of
    the same requests without prompt logprobs (the scored prefill writes the same state)."""
    target = tiny_pair[0]
    prompts = [[(7 * i + 3) % 64 for i in range(41)], [5], PROMPTS[2]]
    asked = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=3)
    plain = SamplingParams(temperature=0.0, max_tokens=4)
    outs = engine.generate(prompts, [asked, asked, plain])
    assert [o.token_ids for o in outs] == [o.token_ids for o in engine.generate(prompts, plain)]
    assert outs[1].prompt_logprobs == [None] and outs[2].prompt_logprobs is None
    entries = outs[0].prompt_logprobs
    assert len(entries) == len(prompts[0]) and entries[0] is None
    for t in range(1, len(prompts[0])):
        _check_entry(entries[t], prompts[0][t], _log_softmax(oracle_logits(target, prompts[0][:t])), 3)
    assert any(len(e) == 4 for e in entries[1:])  # a prompt token outside the top 3


def test_prompt_logprobs_zero_on_a_default_engine_and_in_groups(tiny_pair, engine):
    """prompt_logprobs=0 (each token's own logprob) needs no max_logprobs: the engine
    compiles its scored prefill when a request first asks. A group's completions (n=2)
    share one prefill and carry equal, separate prompt_logprobs."""
    default = _engine(tiny_pair, 0, schedule=(2,))
    prompt = PROMPTS[2]
    outs = default.generate([prompt], SamplingParams(temperature=1.0, seed=1, n=2, max_tokens=3,
                                                     prompt_logprobs=0))
    first, second = (o.prompt_logprobs for o in outs)
    assert first == second and first is not second and first[1] is not second[1]
    assert [list(e) for e in first[1:]] == [[t] for t in prompt[1:]]
    ref = engine.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=2))[0].prompt_logprobs
    np.testing.assert_allclose([e[t] for e, t in zip(first[1:], prompt[1:])],
                               [e[t] for e, t in zip(ref[1:], prompt[1:])], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"prompt_logprobs=1 .*max_logprobs=0"):
        default.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=1))


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


def test_prompt_logits_are_taken_a_few_positions_at_a_time(tiny_pair, engine, monkeypatch):
    """Under a logits budget smaller than a chunk's, the scored prefill applies the LM head
    to a few positions at a time (`step.logits_block`): the prompt logprobs are those of the
    whole chunk's logits at once, and the compiled program's scratch shrinks with the block
    (a [8, 64, 32000] float32 logits array is 62.5 MiB; in blocks of 4 positions, 3.9)."""
    assert [step.logits_block(4, 16, 64, b) for b in (4 * 16 * 64 * 4, 4 * 5 * 64 * 4, 1)] == [16, 4, 1]
    monkeypatch.setattr(step, "PROMPT_LOGITS_BYTES", 4 * 2 * 64 * 4)  # 2 positions of 4 rows
    blocked = _engine(tiny_pair, N, schedule=(2,))
    prompts = [[(5 * i + 2) % 64 for i in range(23)], PROMPTS[2]]
    asked = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=N)
    got, want = (e.generate(prompts, asked) for e in (blocked, engine))
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and len(g.prompt_logprobs) == len(w.prompt_logprobs)
        for a, b in zip(g.prompt_logprobs[1:], w.prompt_logprobs[1:]):
            assert list(a) == list(b)
            np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=0, atol=1e-6)

    rows, positions, d, vocab = 8, 64, 16, 32000
    w_head = jnp.zeros((d, vocab), jnp.float32)
    hidden = jax.ShapeDtypeStruct((rows, positions, d), jnp.float32)
    nxt = jax.ShapeDtypeStruct((rows, positions), jnp.int32)

    def scratch(budget):
        fn = lambda h, t: step.pack_prompt_logprobs(lambda x: x @ w_head, h, t, 5, budget)
        return jax.jit(fn).lower(hidden, nxt).compile().memory_analysis().temp_size_in_bytes

    whole = rows * positions * vocab * 4
    assert scratch(whole) >= whole and scratch(rows * 4 * vocab * 4) < whole / 8
