"""Prompts that begin alike, prefilled once (`dsd_jax.prefix_sharing`,
`SpecEngine(share_prefixes=True)`): the plan, and an engine's outputs against an engine
that prefills every prompt whole and against fresh full-sequence forwards."""

import jax
import numpy as np
import pytest

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models, prefix_sharing, profiler
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


def test_a_request_taking_a_kept_slots_prefix_is_seated_in_it():
    """New requests fill slots 4..7; b and d take from kept slots 6 and 5, c from slot 9
    (beyond theirs), e from 6 too: b sits in 6 and d in 5, the rest keep their order."""
    a, b, c, d, e = (object() for _ in range(5))
    order = prefix_sharing.seat([a, b, c, d, e], 4, {id(b): 6, id(c): 9, id(d): 5, id(e): 6})
    assert [id(r) for r in order] == [id(r) for r in (a, d, b, c, e)]
    assert prefix_sharing.seat([a, b], 0, {}) == [a, b]
    kept = prefix_sharing.retained([1, 2, 3], [4, 5], prompt_drafted=True)
    assert kept.sequence.tolist() == [1, 2, 3, 4, 5] and kept.prompt_length == 3
    # the drafter's state past the drafted prompt is unknown: a taker of more is admitted
    # with the prompt's length (its drafter catches the rest up), of a prompt left to the
    # catch-up with nothing
    assert kept.drafter_held(2) is None and kept.drafter_held(3) == 3 and kept.drafter_held(4) == 3
    assert kept._replace(prompt_drafted=False).drafter_held(1) == 1


def test_records_in_the_slots_being_filled_move_out_of_the_way():
    """Slots 4..6 are filled; 4, 5, 7 and 8 keep records (ages: larger is newer). The taker
    in 4 takes from 8, beyond the range, so the two swap (its share in place, 4's record in
    8); the request in 6 takes from 8 too and copies from 4 then; 5's record (a whole
    prefill sits there) goes to 9, the one free slot keeping nothing. A record in a seated
    taker's own donor slot stays. With no free slot left, a record goes over the oldest one
    beyond the range that is older and no taker uses, the newest first; else it is lost."""
    ages = {4: 1, 5: 2, 7: 3, 8: 4}
    plan = prefix_sharing.preserve(4, 7, 10, ages, {4: 8, 6: 8})
    assert plan.swaps == [(8, 4)] and plan.copies == [(5, 9)] and plan.evicted == []
    assert plan.where == {8: 4, 4: 8, 5: 9}
    assert prefix_sharing.preserve(4, 6, 6, {4: 1, 5: 1}, {4: 4}) == ([], [], {}, [])
    # a taker whose donor is in the range, not seated (another taker sits there), on a record
    assert prefix_sharing.preserve(0, 2, 3, {0: 1, 1: 1}, {0: 0, 1: 0}).copies == [(1, 2)]
    # no free slot: slot 1's record (age 9) goes over 4's (age 2), then 0's (5) over 3's (4);
    # 5 is older still, but the taker in 2 (on no record) uses it; a record older than all
    # is lost
    plan = prefix_sharing.preserve(0, 3, 6, {0: 5, 1: 9, 3: 4, 4: 2, 5: 1}, {2: 5})
    assert plan.swaps == [] and plan.copies == [(1, 4), (0, 3)] and plan.evicted == [4, 3]
    assert plan.moved({1: "b", 0: "a", 3: "c", 4: "d", 5: "e"}) == {4: "b", 3: "a", 5: "e"}
    assert prefix_sharing.preserve(0, 1, 3, {0: 1, 1: 2, 2: 3}, {}) == ([], [], {}, [])


def test_placement_sends_a_prompt_to_the_shard_holding_its_start():
    """Two shards, two new requests each (the balance by load): the longest shares go
    first to their shards; a prompt whose best shard is full takes its next best; one with
    nothing to share anywhere is left to placement by load (None)."""
    pre = list(PREAMBLE)
    donors = [[pre + [1] * 8], [pre + [2] * 8, [5] * 40]]
    prompts = [pre + [2] * 9, pre + [1] * 9, pre + [2] * 3, [7] * 40, pre + [2] * 5]
    # shares: 48 on shard 1; 48 on shard 0; 43 on 1 (41 on 0); none; 45 on 1 (41 on 0)
    assert prefix_sharing.longest_shares(prompts, donors[1]) == [48, 41, 43, 0, 45]
    assert prefix_sharing.place(prompts, donors, [2, 2]) == [1, 0, 0, None, 1]
    assert prefix_sharing.place(prompts, donors, [3, 1]) == [1, 0, 0, None, 0]


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


class _DraftsFromTheSecondAdmission(FixedK):
    """A static-mode controller: K = 0 and no draft prefill at the first admission, K = 2
    and a drafted admission from the second on (`DispatchPolicy.draft_at_admission` reads
    `spec.schedule_k`)."""

    mode = "static"

    def __init__(self):
        super().__init__([0])
        self.spec, self.admissions = self, 0

    def schedule_k(self, batch_size):
        self.admissions += 1
        return 0 if self.admissions == 1 else 2

    def choose_k(self, batch_size, context_len=None, request_ids=None):
        return 0 if self.admissions < 2 else 2


def test_a_running_prompt_left_to_the_catch_up_still_donates(tiny_pair):
    """a and x are admitted at K = 0, so a's prompt is not in the draft's cache; b, admitted
    when x ends and the controller turns to K = 2 (a drafting admission), still takes 45
    positions from a's running slot, and leaves its own prompt to the draft's catch-up: with
    the target as its own draft every draft is accepted, and the tokens equal whole
    prefills'."""
    target, _ = tiny_pair
    a, x = PREAMBLE + [1] * 10, [5] * 40
    b = a[:45] + [3, 3]
    sampling = [SamplingParams(temperature=0.0, max_tokens=m) for m in (30, 3, 10)]
    engines = [SpecEngine(target, target, SpecConfig(method="draft_model", num_speculative_tokens=2),
                          max_batch_size=2, max_seq_len=128, prefill_chunk=16, share_prefixes=share,
                          controller=_DraftsFromTheSecondAdmission()) for share in (True, False)]
    outs = [e.generate([a, x, b], sampling) for e in engines]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
    assert engines[0].metrics()["shared_prefix_tokens"] == 45
    stats = engines[0].stats
    assert stats.proposed_per_pos.sum() > 0
    np.testing.assert_array_equal(stats.accepted_per_pos, stats.proposed_per_pos)


RNG = np.random.default_rng(7)
TURN1 = [RNG.integers(2, 64, 36 + 3 * i).tolist() for i in range(4)]


TURNS = [SamplingParams(temperature=0.0, max_tokens=m) for m in (5, 12, 3, 8)]


def _next_turn(engine, first, second, order=(3, 1, 0, 2)):
    """A second call after the first turn's (`first`, its outputs): each chosen prompt
    followed by its completion and two tokens of its own (a multi-turn rollout's next
    prompt)."""
    prompts = [TURN1[i] + list(first[i].token_ids) + [9, 9] for i in order]
    engine.reset_metrics()
    return prompts, engine.generate(prompts, second)


def _multi_turn(engine, second, order=(3, 1, 0, 2)):
    return _next_turn(engine, engine.generate(TURN1, TURNS), second, order)


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_a_next_turn_takes_its_prompt_and_completion_from_the_slot_that_kept_them(tiny_pair, method):
    """Four requests finish and their slots keep what they wrote; a second call whose prompts
    are those prompts, their completions and two more tokens prefills only the new tokens
    and its own last one: every position but those is shared, whatever order the call
    sends them in (each sits in its donor's slot). Tokens equal whole prefills'. The first
    turn decodes at K = 0, so the draft model never ran over its completions: the takers
    catch the draft up from scratch, and with the target as its own draft every draft of
    the second turn is accepted (a draft cache taken from the kept slot was not)."""
    target, _ = tiny_pair
    spec = SpecConfig(method=method, num_speculative_tokens=2)
    engines = [SpecEngine(target, target if method == "draft_model" else None, spec, max_batch_size=4,
                          max_seq_len=128, prefill_chunk=16, share_prefixes=share, controller=FixedK([0]))
               for share in (True, False)]
    second = SamplingParams(temperature=0.0, max_tokens=10)
    firsts = [e.generate(TURN1, TURNS) for e in engines]
    for e in engines:
        e.controller = FixedK([2])
    (prompts, got), (_, want) = (_next_turn(e, first, second) for e, first in zip(engines, firsts))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engines[0].metrics()["shared_prefix_tokens"] == sum(len(p) - 3 for p in prompts)
    assert engines[0].metrics()["prefill_tokens"] == 3 * len(prompts)
    if method == "draft_model":
        stats = engines[0].stats
        assert stats.proposed_per_pos.sum() > 0
        np.testing.assert_array_equal(stats.accepted_per_pos, stats.proposed_per_pos)


def test_a_kept_slot_beyond_the_admitted_ones_is_copied_and_groups_follow(tiny_pair):
    """One second-turn prompt, sampled twice (n = 2): its donor's slot is not slot 0, so the
    kept slot is copied into slot 0 and then into the sibling's; the completions are those of
    whole prefills."""
    target, draft = tiny_pair
    spec = SpecConfig(method="draft_model", num_speculative_tokens=2)
    engines = [SpecEngine(target, draft, spec, max_batch_size=4, max_seq_len=128, prefill_chunk=16,
                          share_prefixes=share, controller=FixedK([2, 0])) for share in (True, False)]
    firsts = [e.generate(TURN1, TURNS) for e in engines]
    far = max(engines[0]._retained[0])
    kept = engines[0]._retained[0][far].sequence.tolist()
    which = next(i for i, p in enumerate(TURN1) if kept[:len(p)] == p)
    second = SamplingParams(temperature=1.0, max_tokens=10, seed=5, n=2)
    (prompts, got), (_, want) = (_next_turn(e, first, second, order=(which,))
                                 for e, first in zip(engines, firsts))
    assert far > 0 and len(kept) == len(prompts[0]) - 2
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engines[0].metrics()["shared_prefix_tokens"] == len(prompts[0]) - 3


def _kept_slot(engine, prompt):
    return next(slot for slot, kept in engine._retained[0].items() if kept.sequence.tolist() == prompt)


@pytest.mark.parametrize("first_turns", [4, 2])
def test_turns_arriving_one_at_a_time_keep_each_others_records(tiny_pair, first_turns):
    """Next turns arrive one call at a time (an agentic rollout, one thread per episode),
    each filling slot 0. With four slots kept, the first taker's donor is the farthest
    slot: the two swap, and slot 0's record moves there instead of being overwritten. With
    two kept, a new prompt sharing nothing goes to slot 0 and its record moves to a free
    slot. Either way the later turn of slot 0's episode still takes its whole kept
    sequence, and every output is a whole prefill's."""
    target, draft = tiny_pair
    spec = SpecConfig(method="draft_model", num_speculative_tokens=2)
    engines = [SpecEngine(target, draft, spec, max_batch_size=4, max_seq_len=128, prefill_chunk=16,
                          share_prefixes=share, controller=FixedK([2, 0])) for share in (True, False)]
    firsts = [e.generate(TURN1[:first_turns], TURNS[:first_turns]) for e in engines]
    kept = {slot: r.sequence.tolist() for slot, r in engines[0]._retained[0].items()}
    assert sorted(kept) == list(range(first_turns))
    episode = lambda slot: next(i for i in range(first_turns) if kept[slot][:len(TURN1[i])] == TURN1[i])
    second = SamplingParams(temperature=0.0, max_tokens=6)
    if first_turns == 4:
        calls = [(episode(3),), (episode(0),)]
    else:
        calls = [None, (episode(0),)]
    for call in calls:
        if call is None:  # a new episode: nothing to share
            for e in engines:
                e.reset_metrics()
            outs = [e.generate([[63] * 40], second) for e in engines]
            assert engines[0].metrics()["shared_prefix_tokens"] == 0
            assert _kept_slot(engines[0], kept[0]) == 2  # moved to the free slot
        else:
            (prompts, got), (_, want) = (_next_turn(e, first, second, order=call)
                                         for e, first in zip(engines, firsts))
            outs = [got, want]
            assert engines[0].metrics()["shared_prefix_tokens"] == len(prompts[0]) - 3
        assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]


def test_turns_in_random_order_keep_true_records_and_give_whole_prefills_outputs(tiny_pair):
    """Six episodes, six slots, ten calls each continuing one or two of them at random
    (every third sampled n = 2, greedy), every fourth with a new prompt sharing nothing:
    the records move by swaps and copies, over older records too (each happens), every
    kept record's tokens are what its slot holds on the device after each call, and every
    output is a whole prefill's."""
    target, draft = tiny_pair
    spec = SpecConfig(method="draft_model", num_speculative_tokens=2)
    engines = [SpecEngine(target, draft, spec, max_batch_size=6, max_seq_len=192, prefill_chunk=16,
                          share_prefixes=share, controller=FixedK([2, 0])) for share in (True, False)]
    moves = {"swaps": 0, "copies": 0, "evicted": 0}
    preserve = prefix_sharing.preserve

    def counted(*args):
        plan = preserve(*args)
        for name in moves:
            moves[name] += len(getattr(plan, name))
        return plan
    # patched without the `monkeypatch` fixture, which keeps a test's programs its own: the
    # plan is host-side, so the two engines share theirs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prefix_sharing, "preserve", counted)
        rng = np.random.default_rng(3)
        prompts = [rng.integers(2, 64, int(rng.integers(36, 50))).tolist() for _ in range(6)]
        shared = 0
        for call in range(10):
            chosen = rng.choice(6, size=int(rng.integers(1, 3)), replace=False).tolist()
            batch = [prompts[i] for i in chosen] + ([rng.integers(2, 64, 40).tolist()] if call % 4 == 3 else [])
            sampling = SamplingParams(temperature=0.0, max_tokens=int(rng.integers(3, 9)), n=2 if call % 3 == 2 else 1)
            for e in engines:
                e.reset_metrics()
            outs = [e.generate(batch, sampling) for e in engines]
            assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
            shared += engines[0].metrics()["shared_prefix_tokens"]
            held = jax.device_get(engines[0].state.tokens)
            for slot, kept in engines[0]._retained[0].items():
                assert held[slot, :len(kept.sequence)].tolist() == kept.sequence.tolist(), (call, slot)
            for i, out in zip(chosen, outs[0][::sampling.n]):
                prompts[i] = prompts[i] + list(out.token_ids) + rng.integers(2, 64, 2).tolist()
    assert shared > 0 and min(moves.values()) > 0, (shared, moves)


def test_an_eagle3_head_takes_a_kept_completion_and_catches_its_entries_up(tmp_path):
    """A head's entries after the prompt may lag (the first turn runs at K = 0: none past
    the prompts), so a second turn taking prompt and completion from kept slots is admitted
    with the entries of the first prompt alone, and its first round catches the rest up from
    the stored features: everything but the last three positions is shared, the tokens are
    those of whole prefills, and so is every draft's acceptance."""
    target = scaled(models.init_model(tiny_config(num_layers=4), seed=0), 3.0)
    cfg = head_config(64, 48)
    head = str(write_head(tmp_path / "head", cfg, head_tensors(cfg, seed=1)))
    spec = SpecConfig(method="eagle3", num_speculative_tokens=3, model=head)
    engines = [SpecEngine(target, None, spec, max_batch_size=8, max_seq_len=128, prefill_chunk=16,
                          controller=FixedK([0])) for _ in range(2)]
    firsts = [e.generate(TURN1, TURNS) for e in engines]  # at K = 0: no entry past the prompts
    engines[1].reset_prefix_cache()  # the second prefills whole (and keeps its slots: below)
    for e in engines:
        e.controller = FixedK([3])
    second = SamplingParams(temperature=0.0, max_tokens=10)
    (prompts, got), (_, want) = (_next_turn(e, first, second) for e, first in zip(engines, firsts))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engines[0].metrics()["shared_prefix_tokens"] == sum(len(p) - 3 for p in prompts)
    assert engines[1].metrics()["shared_prefix_tokens"] == 0
    shared, whole = (e.stats for e in engines)
    assert shared.proposed_per_pos.sum() > 0
    np.testing.assert_array_equal(shared.accepted_per_pos, whole.accepted_per_pos)
    # the head's entries over each second-turn prompt equal whole prefills' (in the slot
    # each engine's finished request was kept in)
    states = [jax.device_get(e.state.drafter) for e in engines]
    for prompt in prompts:
        slots = [next(slot for slot, kept in e._retained[0].items() if kept.sequence[:len(prompt)].tolist() == prompt)
                 for e in engines]
        for cache in ("k", "v"):
            entries = [getattr(st.kv, cache)[0][slot, :, :len(prompt) - 2] for st, slot in zip(states, slots)]
            assert np.abs(entries[1]).sum() > 0
            np.testing.assert_allclose(*entries, rtol=1e-4, atol=1e-5)


def test_a_finished_request_donates_within_a_run(tiny_pair):
    """Two slots: a finishes first and its slot keeps prompt and completion; c, admitted
    then, begins with a's prompt and more of it than the running b shares, so it takes
    a's 51 prompt positions from the kept slot (and sits in it); b took the preamble from
    a when both were admitted."""
    target, draft = tiny_pair
    a, b = PREAMBLE + [1] * 10, PREAMBLE + [2] * 10
    c = a + [5]
    sampling = [SamplingParams(temperature=0.0, max_tokens=m) for m in (2, 30, 5)]
    engines = [SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=2),
                          max_batch_size=2, max_seq_len=128, prefill_chunk=16, share_prefixes=share,
                          controller=FixedK([2])) for share in (True, False)]
    outs = [e.generate([a, b, c], sampling) for e in engines]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
    assert engines[0].metrics()["shared_prefix_tokens"] == len(PREAMBLE) + len(a)


@pytest.mark.parametrize("forget", ["set_params", "state_written", "reset_prefix_cache"])
def test_new_weights_or_a_written_state_forget_what_slots_kept(tiny_pair, forget):
    """What the slots kept is the old weights' KV: after set_params (even of equal weights),
    a state written outside a run (the profiler's), or reset_prefix_cache(), a second turn
    shares nothing, and its tokens are those of whole prefills."""
    target, draft = tiny_pair
    engines = [_engine(tiny_pair, share, schedule=[2]) for share in (True, False)]
    second = SamplingParams(temperature=0.0, max_tokens=6)
    firsts = [e.generate(TURN1, TURNS) for e in engines]
    if forget == "set_params":
        engines[0].set_params(target=target)
    elif forget == "state_written":
        with profiler._borrowed_state(engines[0], profiler._state_programs(engines[0]), 0, 0.0):
            pass
    else:
        engines[0].reset_prefix_cache()
    (_, got), (_, want) = (_next_turn(e, first, second) for e, first in zip(engines, firsts))
    assert engines[0].metrics()["shared_prefix_tokens"] == 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
