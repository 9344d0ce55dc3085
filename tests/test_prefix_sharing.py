"""Prompts that begin alike, prefilled once (`dsd_jax.prefix_sharing`,
`SpecEngine(share_prefixes=True)`): the plan, and an engine's outputs against an engine
that prefills every prompt whole and against fresh full-sequence forwards."""

import jax
import numpy as np
import pytest

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models, prefix_sharing
from conftest import FixedK, oracle_logits, scaled, tiny_config
from test_eagle3 import head_config, head_tensors, write_head

M = prefix_sharing.MIN_SHARED_PREFIX
PREAMBLE = [(11 * i + 5) % 60 + 2 for i in range(M + 9)]  # 41 tokens


def test_the_plan_shares_the_longest_prefix_with_an_earlier_whole_prompt():
    a = PREAMBLE + [1, 2, 3]
    b = PREAMBLE + [1, 2, 9, 9]  # shares 43 with a
    c = PREAMBLE[:M] + [0] * 10  # shares exactly M with a and b
    d = PREAMBLE[:M - 1] + [0] * 10  # one short of M: whole
    e = list(PREAMBLE)  # a prefix of a: its last token is its own, so 40 shared
    f = a + [4, 4]  # extends a: a's last token is pending in a's slot, so 43 shared
    g = [63] * 50  # another beginning: whole, and a donor for h
    h = [63] * 60
    plan = prefix_sharing.plan([a, b, c, d, e, f, g, h], [True] * 8)
    assert plan == [None, (0, 43), (0, M), None, (0, M + 8), (0, 43), None, (6, 49)]
    # a request that may not share (it asks for prompt logprobs) is prefilled whole and
    # donates; a prompt no longer than M neither takes nor gives
    assert prefix_sharing.plan([a, b, a], [False, False, True]) == [None, None, (0, 43)]
    assert prefix_sharing.plan([PREAMBLE[:M], PREAMBLE[:M]], [True, True]) == [None, None]
    assert prefix_sharing.plan([a, b], [True, True], min_shared=44) == [None, None]
    assert prefix_sharing.common_prefix(np.array([1, 2, 3]), np.array([1, 2])) == 2


def _engine(pair, share, schedule=(0, 3, 1, 2), **kw):
    target, draft = pair
    return SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=3),
                      max_batch_size=16, max_seq_len=128, prefill_chunk=16, share_prefixes=share,
                      controller=FixedK(list(schedule)), **kw)


PROMPTS = [PREAMBLE + [1, 2, 3], PREAMBLE + [1, 2, 9, 9, 4], PREAMBLE[:M] + [7] * 20, [5, 6, 7],
           list(PREAMBLE), PREAMBLE + [1, 2, 3, 8]]


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0.0, max_tokens=10),
    SamplingParams(temperature=1.0, max_tokens=10, seed=3, n=2)], ids=["greedy", "sampled_groups"])
def test_shared_prefixes_give_the_outputs_of_whole_prefills(tiny_pair, sampling):
    """Outputs equal to an engine prefilling every prompt whole, through K = 0..3 rounds;
    greedy ones equal to fresh full forwards' argmax too. The counts say what was shared:
    prompts 1, 2, 4 and 5 take 43, 32, 40 and 43 positions from prompt 0's slot."""
    shared, whole = (_engine(tiny_pair, s) for s in (True, False))
    got, want = (e.generate(PROMPTS, sampling) for e in (shared, whole))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert shared.metrics()["shared_prefix_tokens"] == 43 + M + 40 + 43
    assert whole.metrics()["shared_prefix_tokens"] == 0
    assert shared.metrics()["prefill_tokens"] + 43 + M + 40 + 43 == whole.metrics()["prefill_tokens"]
    if sampling.temperature == 0.0:
        target = tiny_pair[0]
        for prompt, out in zip(PROMPTS, got):
            seq = list(prompt)
            for token in out.token_ids:
                assert token == int(np.argmax(oracle_logits(target, seq)))
                seq.append(token)


def _pair_of_engines(target, draft, spec, schedule):
    return [SpecEngine(target, draft, spec, max_batch_size=8, max_seq_len=128, prefill_chunk=16,
                       share_prefixes=share, controller=FixedK(schedule)) for share in (True, False)]


def test_the_draft_models_cache_below_a_share_is_the_donors(tiny_pair):
    """Drafts are verified, so a wrong drafter state below a share would cost acceptance,
    not tokens. With the target as its own draft every draft is accepted when the draft's
    cache is right: the counts per position equal whole prefills', and are full."""
    target, _ = tiny_pair
    engines = _pair_of_engines(target, target, SpecConfig(method="draft_model", num_speculative_tokens=3), [3])
    outs = [e.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12)) for e in engines]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
    shared, whole = (e.stats for e in engines)
    assert engines[0].metrics()["shared_prefix_tokens"] == 43 + M + 40 + 43
    np.testing.assert_array_equal(shared.accepted_per_pos, whole.accepted_per_pos)
    np.testing.assert_array_equal(shared.accepted_per_pos, shared.proposed_per_pos)


def test_an_eagle3_heads_state_below_a_share_is_the_donors(tmp_path):
    """An EAGLE-3 head keeps the target's features by position and its own cache of entries
    (entry p: feature p with token p+1). After admission (and one K = 0 round), each
    prompt's features at 0..len-2 and head entries at 0..len-3 equal those of whole
    prefills: below the share they are the donor's, and entry P-1, which pairs the donor's
    feature with the taker's own token P, is the taker's own prefill's."""
    target = scaled(models.init_model(tiny_config(num_layers=4), seed=0), 3.0)
    cfg = head_config(64, 48)
    head = str(write_head(tmp_path / "head", cfg, head_tensors(cfg, seed=1)))
    engines = _pair_of_engines(target, None, SpecConfig(method="eagle3", num_speculative_tokens=3, model=head), [0])
    for e in engines:
        e.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=1))
    assert engines[0].metrics()["shared_prefix_tokens"] == 43 + M + 40 + 43
    shared, whole = (jax.device_get(e.state.drafter) for e in engines)
    for slot, prompt in enumerate(PROMPTS):
        n = len(prompt)
        features = [st.features[slot, :n - 1] for st in (shared, whole)]
        assert np.abs(features[1]).sum() > 0
        np.testing.assert_allclose(*features, rtol=1e-4, atol=1e-5)
        for cache in ("k", "v"):
            entries = [getattr(st.kv, cache)[0][slot, :, :n - 2] for st in (shared, whole)]
            assert np.abs(entries[1]).sum() > 0
            np.testing.assert_allclose(*entries, rtol=1e-4, atol=1e-5)


def test_a_prompt_logprobs_request_is_prefilled_whole_beside_sharing_ones(tiny_pair):
    """A request asking for prompt logprobs is prefilled whole (only its own prefill scores
    its prompt) and others share its prefix; its entries are the full forward's."""
    engine = _engine(tiny_pair, True, max_logprobs=2)
    asks = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2)
    plain = SamplingParams(temperature=0.0, max_tokens=4)
    outs = engine.generate(PROMPTS[:2] + PROMPTS[1:2], [plain, asks, plain])
    assert engine.metrics()["shared_prefix_tokens"] == 45  # the third from the second's slot
    assert outs[0].prompt_logprobs is None and outs[2].prompt_logprobs is None
    prompt = PROMPTS[1]
    for t in range(1, len(prompt)):
        logits = oracle_logits(tiny_pair[0], prompt[:t]).astype(np.float64)
        want = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert outs[1].prompt_logprobs[t][prompt[t]] == pytest.approx(want[prompt[t]], abs=2e-5)
    assert outs[1].token_ids == outs[2].token_ids


def test_share_prefixes_must_be_a_bool(tiny_pair):
    with pytest.raises(TypeError, match="share_prefixes must be True or False"):
        _engine(tiny_pair, "yes")


def test_a_short_share_before_long_prompts_is_not_worth_a_second_prefill(tiny_pair):
    """Eight prompts sharing 32 tokens, then 480 of their own: the two prefills sharing takes
    (one whole, then seven of 480 in a bucket of 8) cost more than one of all eight whole
    (`buckets.prefill_cost`), so none is shared. Sharing 480 before 32 own, it is."""
    target, _ = tiny_pair
    engine = SpecEngine(target, None, SpecConfig(method="ngram", num_speculative_tokens=2),
                        max_batch_size=8, max_seq_len=520, prefill_chunk=256, controller=FixedK([0]))
    rng = np.random.default_rng(0)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    for shared, own, taken in ((32, 480, 0), (480, 32, 7 * 480)):
        preamble = rng.integers(2, 64, shared).tolist()
        engine.reset_metrics()
        engine.generate([preamble + rng.integers(2, 64, own).tolist() for _ in range(8)], one)
        assert engine.metrics()["shared_prefix_tokens"] == taken


def test_a_running_request_donates_its_prompt_to_later_admissions(tiny_pair):
    """Two slots, five prompts behind the preamble, finishing at different times: each
    request admitted after the first two takes the preamble from a running request's slot
    (every prompt shares its 41 tokens), with the tokens of whole prefills; with the target
    as its own draft every draft is still accepted (the donor's draft cache is right)."""
    target, _ = tiny_pair
    prompts = [PREAMBLE + [i, 7, 7] for i in range(5)]
    sampling = [SamplingParams(temperature=0.0, max_tokens=m) for m in (3, 40, 6, 30, 9)]
    engines = [SpecEngine(target, target, SpecConfig(method="draft_model", num_speculative_tokens=2),
                          max_batch_size=2, max_seq_len=128, prefill_chunk=16, share_prefixes=share,
                          controller=FixedK([2])) for share in (True, False)]
    outs = [e.generate(prompts, sampling) for e in engines]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
    assert engines[0].metrics()["shared_prefix_tokens"] == 4 * len(PREAMBLE)
    shared = engines[0].stats
    np.testing.assert_array_equal(shared.accepted_per_pos, shared.proposed_per_pos)
