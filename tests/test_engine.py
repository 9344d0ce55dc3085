"""Engine behaviour: continuous batching, queueing, bad input, RL rollout conventions."""

import collections
import dataclasses
import gc
import warnings
import re

import jax
import numpy as np
import pytest

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models
from dsd_jax.compilation import compilation_count
from dsd_jax.rollout import to_padded_arrays
from conftest import FixedK, greedy_reference, make_engine, scaled, tiny_config


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return scaled(tiny_pair[0], 3.0), tiny_pair[1]


@pytest.fixture(scope="module")
def engine(pair):
    return make_engine(*pair, method="draft_model", max_seq_len=48)


def test_bad_input_is_refused_and_nothing_else_is_affected(engine, pair):
    engine.controller = FixedK([2])
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1, 2], []])
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.generate([list(range(1, 49))])
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[1, 999]])
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate(["def f():"])
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.generate([[1], [2]], [SamplingParams()])
    # after the refusals the engine still serves correctly
    out = engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=8))
    assert out[0].token_ids == greedy_reference(pair[0], [1, 2, 3], 8)


def test_k_outside_compiled_range_and_bucket_errors(engine):
    engine.controller = FixedK([5])
    with pytest.raises(ValueError, match="K=5"):
        engine.generate([[1, 2]], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="bucket"):
        engine.programs.step(1, 128)


def test_invalid_configs():
    target = models.init_model(tiny_config(), 0)
    other_vocab = models.init_model(tiny_config(vocab_size=32), 0)
    with pytest.raises(ValueError, match="draft"):
        SpecEngine(target, None, SpecConfig(method="draft_model"))
    # a vocabulary padded to another size is bridged (`test_a_draft_with_a_differently_padded_...`)
    SpecEngine(target, other_vocab, SpecConfig(method="draft_model"), max_batch_size=1, max_seq_len=16)
    with pytest.raises(ValueError, match="max_batch_size"):
        SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=0)


def test_queueing_mixed_sampling_and_rollout_arrays(engine, pair):
    """More requests than slots queue and are admitted while others run; greedy and
    sampled rows share a batch without affecting each other."""
    engine.controller = FixedK([0, 3, 1, 4])
    prompts = [[i % 60 + 1, 3, 5][: 1 + i % 3] for i in range(10)]
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, top_k=5 * (i % 3), max_tokens=4 + i,
                             seed=i) for i in range(10)]
    outs = engine.generate(prompts, params, return_logprobs=True)
    for p, sp, o in zip(prompts, params, outs):
        assert len(o.token_ids) == sp.max_tokens and o.finish_reason == "length"
        assert len(o.logprobs) == len(o.token_ids) and all(lp <= 0 for lp in o.logprobs)
        if sp.temperature == 0:
            assert o.token_ids == greedy_reference(pair[0], p, sp.max_tokens)
    # reproducible for fixed seeds and the same K schedule, whatever the batch composition
    engine.controller = FixedK([0, 3, 1, 4])
    again = engine.generate(prompts[:3], params[:3])
    assert [o.token_ids for o in again] == [o.token_ids for o in outs[:3]]

    arrays = to_padded_arrays(outs, pad_id=0)
    assert arrays["prompt_tokens"].shape == (10, 3)
    assert arrays["completion_mask"].sum() == sum(len(o.token_ids) for o in outs)
    assert (arrays["prompt_mask"][:, -1]).all()  # left-padded prompts end at the boundary
    np.testing.assert_allclose(arrays["completion_logprobs"][9, :13], outs[9].logprobs)
    with pytest.raises(ValueError):
        to_padded_arrays(outs, pad_id=0, completion_len=2)
    # outputs of calls with and without logprobs: an error, not arrays missing the key
    with pytest.raises(ValueError, match=r"outputs \[10, 11, 12\] carry no logprobs"):
        to_padded_arrays(list(outs) + list(again), pad_id=0)
    assert "completion_logprobs" not in to_padded_arrays(again, pad_id=0)


def test_stream_yields_tokens_in_order(engine, pair):
    engine.controller = FixedK([2])
    got = {}
    for index, new in engine.stream([[1, 2, 3], [4]], SamplingParams(temperature=0.0, max_tokens=7)):
        got.setdefault(index, []).extend(new)
    assert got[0] == greedy_reference(pair[0], [1, 2, 3], 7)
    assert got[1] == greedy_reference(pair[0], [4], 7)


def test_stream_says_when_each_completion_finishes(engine, pair):
    """on_output fires once per completion, before its last tokens are yielded, with the
    output `generate` returns for it (logprobs included when asked)."""
    engine.controller = FixedK([2])
    prompts = [[1, 2, 3], [4], [5, 6]]
    sp = [SamplingParams(temperature=0.0, max_tokens=m) for m in (7, 3, 5)]
    events, got = [], {}

    def finished(index, out):
        events.append(("finished", index, list(got.get(index, [])), out))

    for index, new in engine.stream(prompts, sp, on_output=finished, return_logprobs=True):
        got.setdefault(index, []).extend(new)
        events.append(("tokens", index, None, None))
    want = engine.generate(prompts, sp, return_logprobs=True)
    done = {e[1]: e[3] for e in events if e[0] == "finished"}
    assert sorted(done) == [0, 1, 2]
    for i, out in done.items():
        assert out.token_ids == got[i] == want[i].token_ids and out.finish_reason == "length"
        assert out.logprobs == pytest.approx(want[i].logprobs)
        # the callback came before the completion's last tokens, and no tokens followed those
        at = next(n for n, e in enumerate(events) if e[0] == "finished" and e[1] == i)
        after = [e for e in events[at + 1:] if e[0] == "tokens" and e[1] == i]
        assert len(after) == 1 and len(events[at][2]) < len(got[i])


def test_batch_shrinking_rollout_without_recompilation(pair):
    """48 requests with heavy-tailed lengths through 16 slots: every token correct, the live
    batch shrinks to a long tail, and nothing compiles after warm-up (batch 1 -> 16 -> 1
    through buckets 1, 4 and 16, K changing)."""
    target, draft = pair
    engine = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=2),
                        max_batch_size=16, max_seq_len=64, prefill_chunk=16,
                        batch_buckets=(1, 4, 16), controller=FixedK([2, 0, 1, 2, 2, 0]))
    engine.warmup()
    before = compilation_count()
    rng = np.random.default_rng(0)
    lengths = np.minimum(np.ceil(rng.lognormal(1.5, 0.9, size=48)), 56).astype(int)
    prompts = [[int(x) for x in rng.integers(1, 64, size=1 + i % 5)] for i in range(48)]
    engine.generate([[1, 2]], SamplingParams(temperature=0.0, max_tokens=5))
    outs = engine.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=int(n)) for n in lengths])
    engine.generate([[1, 2]], SamplingParams(temperature=0.0, max_tokens=5))
    assert compilation_count() == before
    for p, n, o in zip(prompts, lengths, outs):
        assert o.token_ids == greedy_reference(target, p, int(n))
    batch_trace = [t["batch_size"] for t in engine.stats.trace]
    assert max(batch_trace) == 16 and batch_trace[-2] == 1  # then the final 1-request run
    assert sum(b <= 4 for b in batch_trace) >= 5  # a long tail of small batches
    assert {t["bucket"] for t in engine.stats.trace} == {1, 4, 16}


def test_warmup_runs_every_step_and_leaves_what_callers_see(pair):
    """`warmup()` runs rows through every (K, bucket) step (XLA:CPU finishes a program's code
    on its first rows); the controller, the statistics and the seeds of unseeded requests
    stay as they were, so a warmed engine samples what a cold one does."""
    from dsd_jax.engine import _FixedK
    target, draft = pair
    make = lambda: make_engine(target, draft, controller=FixedK([1, 0]), max_batch_size=4, max_seq_len=24,  # noqa: E731
                               batch_buckets=(2, 4), num_speculative_tokens=1)
    warm, cold = make(), make()
    ran, real = [], warm.generate

    def recording(prompts, sampling=None, **kw):  # on the instance: its programs stay shared
        if isinstance(warm.controller, _FixedK):
            ran.append((warm.controller.k, len(prompts)))
        return real(prompts, sampling, **kw)

    warm.generate = recording
    controller, stats = warm.controller, warm.stats
    warm.warmup()
    assert sorted(ran) == sorted((k, b) for b in (2, 4) for k in range(2))
    assert warm.controller is controller and warm.stats is stats and stats.steps == 0
    sp = SamplingParams(temperature=1.0, max_tokens=6)  # unseeded: seeds from the request count
    prompts = [[1, 2, 3], [4, 5]]
    assert [o.token_ids for o in warm.generate(prompts, sp)] == [o.token_ids for o in cold.generate(prompts, sp)]


class WouldSpeculate(FixedK):
    """Plays the Ks given; to the engine it looks like a goodput controller that holds
    `best_k` at any batch size (what decides whether admission prefills the draft)."""

    mode = "goodput"

    def __init__(self, ks, best_k):
        super().__init__(ks)
        self.best_k = best_k

    def held_k(self, batch_size, context_len=None, request_ids=None, remaining=None):
        return self.best_k


def test_the_draft_takes_in_prompts_only_when_the_controller_would_speculate(pair):
    """Admitted where the controller would not speculate, prompts skip the draft model:
    a run kept at K=0 never runs it, and a later K>0 round catches the whole prompt up;
    greedy output equals plain decoding's either way."""
    eng = make_engine(*pair, method="draft_model", max_seq_len=48)
    prompts = [list(range(1, 21)), [5, 6, 7]]  # 20 tokens: two prefill chunks of 16
    sp = SamplingParams(temperature=0.0, max_tokens=12)
    want = [greedy_reference(pair[0], p, 12) for p in prompts]
    eng.controller = WouldSpeculate([0], best_k=0)
    assert [o.token_ids for o in eng.generate(prompts, sp)] == want
    assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(eng.state.drafter.kv))  # never ran
    for best_k, ks in ((0, [0, 0, 0, 2, 3, 1]), (2, [2, 3, 1]), (0, [4])):
        eng.controller = WouldSpeculate(ks, best_k=best_k)
        assert [o.token_ids for o in eng.generate(prompts, sp)] == want, (best_k, ks)
        assert any(k for k, _ in eng.controller.observed)
    # caught up in the first round or prefilled at admission, the draft proposes the same
    accepted = {}
    for best_k in (2, 0):
        eng.controller = WouldSpeculate([2], best_k=best_k)
        eng.generate(prompts, sp)
        accepted[best_k] = [a.tolist() for _, a in eng.controller.observed]
    assert accepted[0] == accepted[2] and any(map(any, accepted[2]))


class BudgetRecorder(FixedK):
    """A makespan-objective controller that records the remaining budgets it is given."""

    objective = "makespan"

    def __init__(self, ks):
        super().__init__(ks)
        self.seen = []  # (request ids, remaining or None) per choice

    def choose_k(self, batch_size, context_len=None, request_ids=None, remaining=None):
        assert len(request_ids) == batch_size
        self.seen.append((list(request_ids), None if remaining is None else list(remaining)))
        return super().choose_k(batch_size, context_len, request_ids)


def test_makespan_controller_gets_budgets_once_nothing_is_queued(engine, pair):
    """Six requests for four slots: while two wait, no budgets (a finished slot is
    refilled, so throughput counts); then each live request's tokens still allowed,
    max_tokens capped by the slot's length (48) and lagging one step behind."""
    rec = BudgetRecorder([2, 0, 3])
    engine.controller = rec
    prompts = [[1 + i, 2, 3] for i in range(6)]
    max_tokens = [3, 4, 5, 30, 6, 100]
    outs = engine.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens])
    for p, n, o in zip(prompts, max_tokens, outs):
        assert o.token_ids == greedy_reference(pair[0], p, min(n, 48 - 3))
    assert rec.seen[0][1] is None and rec.seen[-1][1] is not None
    first_id = outs[0].request_id
    budgets = {o.request_id: min(n, 48 - 3) for o, n in zip(outs, max_tokens)}
    last = {}
    for ids, remaining in rec.seen:
        if remaining is None:
            continue
        assert len(ids) <= 4 and max(ids) - first_id >= 4  # the queue has drained
        for rid, r in zip(ids, remaining):
            assert 0 <= r <= budgets[rid] and r <= last.get(rid, r)
            last[rid] = r
    assert last[first_id + 5] < 45  # the capped request was counted down


def test_pallas_interpret_backend_matches_xla(pair):
    target, draft = pair
    prompts = [[1, 2, 3], [7, 8]]
    sp = SamplingParams(temperature=0.0, max_tokens=5)
    outs = {}
    for backend in ("xla", "interpret"):
        engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=2), max_batch_size=2,
                            max_seq_len=32, prefill_chunk=16, backend=backend, controller=FixedK([2]))
        outs[backend] = [o.token_ids for o in engine.generate(prompts, sp)]
    assert outs["interpret"] == outs["xla"]


@pytest.mark.parametrize("draft_sampling", ["sample", "argmax"], ids=["dense-q", "one-hot-q"])
def test_pallas_rejection_variants_sample_as_xla_in_the_engine(pair, monkeypatch, draft_sampling):
    """Sampled generation, where the rejection sampler runs (all-greedy steps take a
    shortcut past it), with each Pallas variant interpreted (on a CPU "interpret" builds the
    TPU one unless told): the engine's tokens equal XLA's for the same seeds, with the
    drafter's q and with one-hot q (argmax drafts). Attention stays XLA."""
    from dsd_jax.kernels import KernelBackends, rejection_pallas
    real = rejection_pallas.rejection_sample
    target, draft = pair
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 7, 8, 7]]
    sp = [SamplingParams(temperature=t, max_tokens=16, seed=s) for t, s in ((0.3, 11), (0.6, 12))]
    outs, traced = {}, []

    def pallas_variant(variant):
        def sample(*a, **kw):
            traced.append(variant)
            return real(*a, **{**kw, "platform": variant})
        return sample

    for variant in ("xla", "gpu", "tpu"):
        monkeypatch.setattr(rejection_pallas, "rejection_sample", pallas_variant(variant))
        engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=2, draft_sampling=draft_sampling),
                            max_batch_size=2, max_seq_len=32, prefill_chunk=16, controller=FixedK([2]),
                            backend=KernelBackends("xla", "xla" if variant == "xla" else "interpret"))
        outs[variant] = [o.token_ids for o in engine.generate(prompts, sp)]
        st = engine.stats
        assert 0 < st.accepted_per_pos[0] < st.proposed_per_pos[0]  # drafts accepted and rejected
    assert set(traced) == {"gpu", "tpu"}
    assert outs["gpu"] == outs["xla"] and outs["tpu"] == outs["xla"]


def test_abandoned_stream_frees_its_slots(engine, pair):
    engine.controller = FixedK([2])
    for _ in engine.stream([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_tokens=20)):
        break  # the consumer walks away mid-generation
    assert not np.asarray(engine.state.active).any()
    out = engine.generate([[9, 8]], SamplingParams(temperature=0.0, max_tokens=6))
    assert out[0].token_ids == greedy_reference(pair[0], [9, 8], 6)


def test_one_run_at_a_time_and_an_abandoned_stream_frees_the_engine(engine, pair):
    """A second run while a stream is suspended would take the stream's slots (it lost
    tokens and crashed): it is refused and the stream goes on intact. A stream left by
    break, close(), garbage collection or an error releases the engine."""
    engine.controller = FixedK([2])
    sp = SamplingParams(temperature=0.0, max_tokens=10)
    prompts, other = [[1, 2, 3], [4, 5]], [[7, 8, 9]]
    got = collections.defaultdict(list)
    stream = engine.stream(prompts, sp)
    i, new = next(stream)
    got[i] += new
    with pytest.raises(RuntimeError, match="already running"):
        engine.generate(other, sp)  # e.g. called inside the stream's for loop
    second = engine.stream(other, sp)  # e.g. zip(stream, second)
    with pytest.raises(RuntimeError, match="close"):
        next(second)
    with pytest.raises(RuntimeError, match="set_params while a stream.. or generate.. run"):
        engine.set_params(target=pair[0])  # e.g. a trainer update mid-run
    from dsd_jax.profiler import profile_engine
    with pytest.raises(RuntimeError, match="profile_engine while a stream.*under way.*device state holding"):
        profile_engine(engine, context_lengths=[8], acceptance=[0.5, 0.3, 0.2, 0.1])  # it took the state
    for i, new in stream:
        got[i] += new
    assert [got[i] for i in range(2)] == [greedy_reference(pair[0], p, 10) for p in prompts]

    for _ in engine.stream(prompts, sp):
        break
    left = engine.stream(prompts, sp)
    next(left)
    left.close()
    left = engine.stream(prompts, sp)
    next(left)
    del left
    gc.collect()
    with pytest.raises(KeyError):
        for _ in engine.stream(prompts, sp):
            raise KeyError("the consumer fails")
    engine.controller = FixedK([5])  # the run itself fails (K outside the compiled range)
    with pytest.raises(ValueError, match="K=5"):
        next(engine.stream(prompts, sp))
    engine.controller = FixedK([2])
    out = engine.generate(other, sp)
    assert out[0].token_ids == greedy_reference(pair[0], other[0], 10)


def test_a_dispatch_that_ran_no_round(engine):
    """A 0-round dispatch (what a second run taking the slots led to) crashed `_process`
    with numpy's "argmax of an empty sequence". With no live row it is empty; with live
    rows it is a clear error (another dispatch would run no round either: not a hang)."""
    from dsd_jax.engine import _Dispatch
    from dsd_jax.request import Request
    from dsd_jax.step import MAX_ROUNDS
    out = np.zeros((MAX_ROUNDS, 2, 3 * 3 + 4), np.int32)  # K = 2, B = 2; rounds run: 0
    assert engine._process(_Dispatch(out, [None, None], 2, 3, 1, False)) == ([], [])
    live = Request(0, [1, 2], SamplingParams(), seed=0)
    with pytest.raises(RuntimeError, match="no round while 1 requests were live"):
        engine._process(_Dispatch(out, [live, None], 2, 3, 1, False))


def test_stream_joins_to_generate_with_and_without_the_stop_token(engine, pair):
    """stream() yielded the stop token that include_stop_token=False drops from generate()."""
    engine.controller = FixedK([2])
    prompts = [[1, 2, 3], [4, 5]]
    ref = greedy_reference(pair[0], prompts[0], 12)
    stop = ref[5]
    end = ref.index(stop)
    for include in (True, False):
        sp = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop],
                            include_stop_token=include)
        outs = engine.generate(prompts, sp, return_logprobs=True)
        streamed = collections.defaultdict(list)
        for i, new in engine.stream(prompts, sp):
            assert new  # no empty events
            streamed[i] += new
        assert outs[0].token_ids == ref[:end + include] and outs[0].finish_reason == "stop"
        assert [streamed[i] for i in range(2)] == [o.token_ids for o in outs]
        assert all(len(o.logprobs) == len(o.raw_logprobs) == len(o.token_ids) for o in outs)


def test_completions_end_at_the_engines_eos_unless_ignore_eos(engine, pair, monkeypatch):
    """As vLLM, a completion ends at the engine's end-of-text ids (default: its tokenizer's)
    as at its stop ids; `ignore_eos` leaves them out, and a request's own stop ids stay."""
    engine.controller = FixedK([2])
    prompt = [1, 2, 3]
    ref = greedy_reference(pair[0], prompt, 12)
    eos, stop = ref[4], ref[7]
    monkeypatch.setattr(engine, "eos_token_ids", (eos,))
    sp = SamplingParams(temperature=0.0, max_tokens=12)
    out = engine.generate([prompt], sp)[0]
    assert out.token_ids == ref[:ref.index(eos) + 1] and out.finish_reason == "stop"
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert out.token_ids == ref and out.finish_reason == "length"
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                   stop_token_ids=[stop]))[0]
    assert out.token_ids == ref[:ref.index(stop) + 1]
    # eight stop ids of its own: the engine's eos would make nine, and the message says so
    eight = SamplingParams(temperature=0.0, max_tokens=4, stop_token_ids=[v for v in range(engine.target_config.vocab_size) if v not in ref][:8])
    with pytest.raises(ValueError, match=r"request 0: 8 stop_token_ids and 1 more of the engine's "
                                         r"eos_token_ids \(ignore_eos=True leaves those out\)"):
        engine.generate([prompt], eight)
    assert len(engine.generate([prompt], dataclasses.replace(eight, ignore_eos=True))[0].token_ids) == 4
    with pytest.raises(ValueError, match="ignore_eos must be a bool"):
        SamplingParams(ignore_eos="no")


def test_eos_token_ids_come_from_the_tokenizer_or_are_checked(pair):
    """`eos_token_ids=None` takes the tokenizer's end-of-text ids that are inside the vocabulary
    (none without a tokenizer); given ones are checked, naming the argument."""
    from tokenizers import Tokenizer, models as tok_models
    from dsd_jax.engine import _eos_ids
    from dsd_jax.inputs import tokenizer_eos_ids
    vocab = pair[0].config.vocab_size
    tok = Tokenizer(tok_models.WordLevel({"a": 0, "<|endoftext|>": 5, "</s>": 7, "<|im_end|>": vocab + 3},
                                         unk_token="a"))
    assert tokenizer_eos_ids(tok) == [5, vocab + 3, 7]
    assert _eos_ids(None, tok, vocab) == (5, 7)  # an id past the model's rows can never be emitted
    assert _eos_ids(None, None, vocab) == ()

    class HFLike:  # a transformers tokenizer: eos_token_id, and an unknown name maps to the unk id
        eos_token_id, unk_token_id = 9, 1
        def convert_tokens_to_ids(self, name):
            return {"<|im_end|>": 11}.get(name, self.unk_token_id)
    assert tokenizer_eos_ids(HFLike()) == [9, 11]
    assert _eos_ids([3, 3, 4], None, vocab) == (3, 4)
    with pytest.raises(ValueError, match=rf"eos_token_ids has {vocab}, outside the vocabulary"):
        _eos_ids([1, vocab], None, vocab)
    with pytest.raises(ValueError, match="eos_token_ids has 9 distinct ids; at most 8"):
        _eos_ids(range(9), None, vocab)
    with pytest.raises(ValueError, match=r"eos_token_ids\[1\] must be an integer"):
        _eos_ids([1, 2.5], None, vocab)
    engine = SpecEngine(*pair, SpecConfig(method="draft_model", num_speculative_tokens=2),
                        max_batch_size=1, max_seq_len=16, tokenizer=tok)
    assert engine.eos_token_ids == (5, 7)


def test_each_run_tells_the_controller_its_median_temperature(engine):
    """So the default controller starts from the profile's acceptance at that temperature."""
    class Recording(FixedK):
        def use_temperature(self, t):
            seen.append(t)
    seen = []
    engine.controller = Recording([2])
    temps = [1.0, 0.0, 0.7]
    engine.generate([[1, 2]] * 3, [SamplingParams(temperature=t, max_tokens=2, seed=0) for t in temps])
    list(engine.stream([[1, 2]], SamplingParams(temperature=0.3, max_tokens=2, seed=0)))
    assert seen == [0.7, 0.3]


def test_request_values_are_checked_before_anything_runs(engine):
    """A stop id outside the vocabulary (or beyond int32) and a seed + n - 1 past uint32
    failed at admission (or wrapped), after earlier requests had decoded: every output of
    the call was lost. Now the call is refused up front, naming the request and value."""
    engine.controller = FixedK([2])
    vocab = engine.target_config.vocab_size
    good = SamplingParams(temperature=0.0, max_tokens=4)
    prompts = [[1, 2]] * 6 + [[3]]  # more than the 4 slots: the last is admitted late
    progress = []
    for bad, match in [
            (SamplingParams(stop_token_ids=[2 ** 40]), "request 6: stop_token_ids has 1099511627776"),
            (SamplingParams(stop_token_ids=[vocab]), f"request 6: stop_token_ids has {vocab}"),
            (SamplingParams(seed=2 ** 32 - 1, n=2), "request 6: seed 4294967295 with n=2")]:
        with pytest.raises(ValueError, match=match):
            engine.generate(prompts, [good] * 6 + [bad], progress=progress.append)
    assert progress == []  # nothing ran


def test_top_k_above_the_vocabulary_keeps_every_token(engine):
    """top_k = 10**10 overflowed int32 at admission; it means what top_k >= vocab means."""
    engine.controller = FixedK([2])
    vocab = engine.target_config.vocab_size
    outs = engine.generate([[1, 2, 3]] * 3, [SamplingParams(temperature=1.0, top_k=k, seed=5, max_tokens=6)
                                             for k in (0, vocab, 10 ** 10)])
    assert outs[0].token_ids == outs[1].token_ids == outs[2].token_ids


def test_token_ids_must_be_integers_and_integer_arrays_are_prompts(engine, pair):
    """Floats, strings, bools and None as token ids were cast ([1.7, 2.9] ran as [1, 2]) or
    failed with raw errors; integer numpy arrays are prompts (a 2-D one, one per row)."""
    engine.controller = FixedK([2])
    sp = SamplingParams(temperature=0.0, max_tokens=4)
    for prompt, value in [([1.7, 2.9], "1.7"), (np.array([1.7, 2.9], np.float32), "float32"),
                          (["1", "2"], "'1'"), ([True, False], "True"), ([1, None], "None"), (5, "5")]:
        with pytest.raises(ValueError, match=f"prompt 1 .*{re.escape(value)}"):
            engine.generate([[1, 2], prompt], sp)
    with pytest.raises(ValueError, match="flat list"):
        engine.generate(list(np.array([1, 2, 3])), sp)
    with pytest.raises(ValueError, match=r"sampling\[1\] .*dict"):
        engine.generate([[1], [2]], [sp, dict(temperature=0.0)])
    with pytest.raises(ValueError, match="sampling must be a SamplingParams"):
        engine.generate([[1], [2]], dict(temperature=0.0))
    with pytest.raises(ValueError, match="reference 0 of prompt 0 .*1.5"):
        engine.generate([[1, 2]], sp, references=[[[1.5]]])
    ref = greedy_reference(pair[0], [1, 2, 3], 4)
    outs = (engine.generate([np.array([1, 2, 3], np.int32)], sp)
            + engine.generate(np.array([[1, 2, 3], [1, 2, 3]], np.int64), sp))
    assert [o.token_ids for o in outs] == [ref] * 3
    assert all(type(t) is int for t in outs[0].prompt_token_ids)


def test_a_tokenizer_whose_encode_returns_a_list(engine, pair):
    """A transformers tokenizer's encode returns a list of ids, not an Encoding with .ids."""

    class ListTokenizer:
        def encode(self, text):
            return [int(w) for w in text.split()]

        def decode(self, ids):
            return " ".join(map(str, ids))

    engine.controller = FixedK([2])
    engine.tokenizer = ListTokenizer()
    try:
        out = engine.generate(["1 2 3"], SamplingParams(temperature=0.0, max_tokens=4))[0]
    finally:
        engine.tokenizer = None
    assert out.prompt_token_ids == [1, 2, 3]
    assert out.token_ids == greedy_reference(pair[0], [1, 2, 3], 4)
    assert out.text == "".join(f" {t}" for t in out.token_ids)  # read after the prompt's "1 2 3", as vLLM


def test_engine_sizes_and_batch_buckets_are_checked_at_construction():
    """A bucket above the slots of a data shard, or <= 0, or not an integer, and a
    prefill_chunk <= 0 were accepted and failed inside JAX at warmup or at first use."""
    target = models.init_model(tiny_config(), 0)

    def build(**kwargs):
        return SpecEngine(target, None, SpecConfig(method="none"), **{"max_batch_size": 4, **kwargs})

    for buckets in [(1, 2, 8), (0, 4), (-2, 4), (1.5, 4), (True, 4), (2, 1, 4), (1, 2), ()]:
        with pytest.raises(ValueError, match="batch_buckets"):
            build(batch_buckets=buckets)
    for chunk in (0, -16, 16.5, "16"):
        with pytest.raises(ValueError, match="prefill_chunk"):
            build(prefill_chunk=chunk)
    with pytest.raises(ValueError, match="max_seq_len"):
        build(max_seq_len=48.0)
    engine = build(batch_buckets=np.array([2, 4]), prefill_chunk=np.int64(32))
    assert engine.batch_buckets == (2, 4) and engine.prefill_chunk == 32


def test_profile_for_other_models_warns(pair, tmp_path):
    from dsd_jax import DynamicConfig
    from dsd_jax.profile import Profile, ProfileMismatchWarning
    path = tmp_path / "profile.json"
    Profile(device_kind="cpu", batch_sizes=[1, 2, 4], ks=[0, 1, 2],
            latency_ms=[[1.0, 1.5, 2.0]] * 3, acceptance=[0.8, 0.6],
            fingerprints={"target": "0000.0000", "draft": "1111.1111"}).save(path)
    spec = SpecConfig(num_speculative_tokens=2, dynamic=DynamicConfig(profile=str(path)))
    with pytest.warns(ProfileMismatchWarning, match="fingerprint"):
        SpecEngine(*pair, spec, max_batch_size=4, max_seq_len=32)
    # a Profile object given to the engine is checked like one it loads
    given = Profile.load(path)
    with pytest.warns(ProfileMismatchWarning, match="the profile given to SpecEngine: .*fingerprint"):
        SpecEngine(*pair, SpecConfig(num_speculative_tokens=2, dynamic=DynamicConfig()), max_batch_size=4,
                   max_seq_len=32, profile=given)
    # a path, as DynamicConfig(profile=) takes one (it raised AttributeError: 'str' object ...)
    with pytest.warns(ProfileMismatchWarning, match="fingerprint"):
        eng = SpecEngine(*pair, SpecConfig(num_speculative_tokens=2, dynamic=DynamicConfig()),
                         max_batch_size=4, max_seq_len=32, profile=path)
    assert eng.controller.profile.acceptance == [0.8, 0.6]
    with pytest.raises(TypeError, match="profile must be a dsd_jax.profile.Profile or a profile JSON path, "
                                        "got dict"):
        SpecEngine(*pair, max_batch_size=4, max_seq_len=32, profile={"ks": [0]})


def test_engine_seed_is_an_integer_in_range(pair):
    """Checked when the engine is built, as SamplingParams.seed: a bad one failed at the first
    generate with an unrelated TypeError, and 2**32 silently equalled seed 0."""
    for bad in (None, 1.5, "3", True, -1, 2**32):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 4294967295\]"):
            SpecEngine(*pair, max_batch_size=1, max_seq_len=16, seed=bad)


def test_progress_counts_finished_requests_and_siblings_own_their_prompt(engine):
    """progress is called as the finished count grows (it recounted every request at every
    event: quadratic in the prompts); the n completions of a prompt each get their own
    prompt list (one shared list: extending one output's prompt extended all three)."""
    engine.controller = FixedK([2])
    seen = []
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8], [9, 1, 2], [3, 3]]
    outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=5, n=2, seed=1),
                           progress=seen.append)
    assert seen == list(range(1, 13))
    siblings = outs[0].prompt_token_ids, outs[1].prompt_token_ids
    assert siblings[0] == siblings[1] == [1, 2, 3] and siblings[0] is not siblings[1]


def test_profile_that_does_not_fit_the_engine_warns(pair, tmp_path):
    """A goodput engine whose profile covers fewer Ks or smaller batches than it runs, or
    another max_seq_len, says so (K was silently capped at the profile's max)."""
    from dsd_jax import DynamicConfig
    from dsd_jax.profile import Profile, ProfileMismatchWarning
    path = tmp_path / "profile.json"
    Profile(device_kind="cpu", batch_sizes=[1, 2], ks=[0, 1], latency_ms=[[1.0, 1.5]] * 2,
            acceptance=[0.8], meta={"engine": {"max_seq_len": 64}}).save(path)
    spec = SpecConfig(num_speculative_tokens=2, dynamic=DynamicConfig(profile=str(path)))
    with pytest.warns(ProfileMismatchWarning) as record:
        SpecEngine(*pair, spec, max_batch_size=4, max_seq_len=32)
    said = " | ".join(str(w.message) for w in record)
    for needle in ("covers batch sizes up to 2 but the engine runs up to 4",
                   "covers K <= 1 but the engine allows K <= 2", "max_seq_len 64, the engine has 32"):
        assert needle in said
    Profile(device_kind="cpu", batch_sizes=[2, 4], ks=[0, 1, 2], latency_ms=[[1.0, 1.5, 2.0]] * 2,
            acceptance=[0.8, 0.6]).save(path)
    with pytest.warns(ProfileMismatchWarning, match="covers batch sizes from 2 but the engine runs from 1"):
        SpecEngine(*pair, spec, max_batch_size=4, max_seq_len=32)


def test_max_seq_len_past_the_models_positions_warns(pair):
    short = models.init_model(tiny_config(max_position_embeddings=16), 0)
    with pytest.warns(UserWarning, match="max_seq_len 32 exceeds the target's max_position_embeddings 16"):
        SpecEngine(short, None, SpecConfig(method="none"), max_batch_size=2, max_seq_len=32)


def test_references_are_lists_of_continuations(engine):
    sp = SamplingParams(temperature=0.0, max_tokens=2)
    with pytest.raises(ValueError, match=r"references\[0\] is one flat list of token ids"):
        engine.generate([[1, 2]], sp, references=[[3, 4, 5]])
    with pytest.raises(ValueError, match=r"references\[0\] must be a list of continuations"):
        engine.generate([[1, 2]], sp, references=["w3 w4"])  # its characters would be references
    with pytest.raises(ValueError, match="references for 2 prompts, expected 1"):
        engine.generate([[1, 2]], sp, references=[[], []])


def test_prefill_pieces_cover_the_prompt_at_least_cost():
    from dsd_jax.buckets import chunk_buckets, prefill_cost, prefill_pieces
    chunks = chunk_buckets(256)
    assert chunks == (16, 32, 64, 128, 256)
    assert chunk_buckets(100) == (16, 32, 64, 100)
    for n in range(1, 700):
        pieces = prefill_pieces(n, chunks)
        # contiguous from 0, every size compiled, covering n with less than a chunk to spare
        assert [s for s, _ in pieces] == list(np.cumsum([0] + [c for _, c in pieces[:-1]]))
        assert all(c in chunks for _, c in pieces)
        assert sum(c for _, c in pieces) - pieces[-1][1] < n <= sum(c for _, c in pieces)
    assert [c for _, c in prefill_pieces(56, chunks)] == [64]  # one padded piece, not 4 x 16
    assert [c for _, c in prefill_pieces(140, chunks)] == [128, 16]  # not one padded 256
    assert [c for _, c in prefill_pieces(600, chunks)] == [256, 256, 128]
    assert prefill_pieces(0, chunks) == []
    # a row's cost in tokens, as the cut weighs it: padded tokens + 32 a piece
    # (prefix sharing compares prefills by it)
    assert [prefill_cost(n, chunks) for n in (0, 24, 88, 536)] == [0, 32 + 32, 128 + 32, 544 + 3 * 32]


def test_only_the_chunks_some_prompt_runs_in_are_compiled(pair):
    from dsd_jax.buckets import chunk_buckets, prefill_pieces, usable_chunks
    chunks = chunk_buckets(256)
    # 159 tokens run as 128 + 32 (cheaper than a padded 256): the 256 chunk never runs
    assert usable_chunks(chunks, 159) == (16, 32, 64, 128)
    assert usable_chunks(chunks, 300) == chunks
    assert usable_chunks(chunks, 1) == (16,)
    assert usable_chunks(chunk_buckets(100), 20) == (16, 32)
    for largest in (16, 24, 100, 128, 256):
        full = chunk_buckets(largest)
        plans = {n: prefill_pieces(n, full) for n in range(1, 520)}
        for longest in (1, 15, 16, 17, 47, 63, 100, 159, 160, 255, 256, 257, 519):
            usable = usable_chunks(full, longest)
            # every prompt that fits is cut as before, and every size kept is run by one
            assert all(prefill_pieces(n, usable) == plans[n] for n in range(1, longest + 1))
            assert set(usable) == {c for n in range(1, longest + 1) for _, c in plans[n]}
    # an engine's prompts hold at most max_seq_len - 1 tokens: 39 run in 16, 32 or 64
    from dsd_jax import SpecConfig, SpecEngine
    short = SpecEngine(pair[0], None, SpecConfig(method="none"), max_batch_size=1, max_seq_len=40,
                       prefill_chunk=256)
    assert short.programs.prefill_chunks == (16, 32, 64)


def test_group_sampling_prefills_each_prompt_once(pair):
    """SamplingParams(n=3): outputs adjacent per prompt; a group admitted together has its
    prompt prefilled once (its slot copied into the siblings'); completion g equals the
    single request with seed + g (rejection sampling, the engine's mode)."""
    engine = make_engine(*pair, method="draft_model", max_seq_len=48, max_batch_size=8)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]
    prefilled = []
    prefill = engine.programs.prefill

    def counting(n, c):
        exe = prefill(n, c)

        def run(*args):
            prefilled.append(int(np.asarray(args[6]).sum()))  # real tokens in this chunk
            return exe(*args)
        return run

    engine.programs.prefill = counting
    try:
        outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=6, seed=9, n=3))
    finally:
        engine.programs.prefill = prefill
    assert sum(prefilled) == sum(map(len, prompts))
    assert [(o.prompt_index, o.index) for o in outs] == [(i, g) for i in range(2) for g in range(3)]
    alone = engine.generate([p for p in prompts for _ in range(3)],
                            [SamplingParams(temperature=1.0, max_tokens=6, seed=9 + g)
                             for _ in prompts for g in range(3)])
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]
    assert len({tuple(o.token_ids) for o in outs[:3]}) > 1  # siblings draw their own streams
    with pytest.raises(ValueError, match="n \\(completions per prompt\\)"):
        SamplingParams(n=0)


def test_dispatches_run_as_many_rounds_as_nothing_can_change(pair):
    """A controller whose K follows the batch size alone (static K) lets a dispatch run up
    to MAX_ROUNDS, as far as the rows' length limits allow (a lone row's runs past its
    limit: the dispatch ends with it), from the second on (the first, right after the
    prefill, runs one round); any other must choose the same K three times
    and then gets a say every ADAPTIVE_ROUNDS; no dispatch is queued behind one in which
    every row finishes; the tokens are plain greedy's either way."""
    from dsd_jax.controller import Controller
    from dsd_jax.dispatch import ADAPTIVE_ROUNDS, STABLE_DECISIONS as STABLE
    from dsd_jax.step import MAX_ROUNDS
    prompts, n = [[3, 1, 4, 1, 5], [2, 7]], 3 * MAX_ROUNDS // 2 + 2
    sp = SamplingParams(temperature=0.0, max_tokens=n)

    def asked(eng, rows):
        log, real = [], eng._policy.rounds
        eng._policy.rounds = lambda *a: log.append(real(*a)) or log[-1]
        got = [o.token_ids for o in eng.generate(prompts[:rows], sp)]
        assert got == [greedy_reference(pair[0], p, n) for p in prompts[:rows]]
        return log

    static = make_engine(*pair, method="draft_model", max_seq_len=64, num_speculative_tokens=1)
    static.controller = Controller(static.spec, None, max_batch_size=4)
    assert static.controller.mode == "static"
    # two rows, K=1: at most 2 tokens a round, 2 of them in flight, so the rounds the room needs
    assert asked(static, 2)[:2] == [1, min(-(-(n - 2) // 2), MAX_ROUNDS)] and n - 2 > 2 * ADAPTIVE_ROUNDS
    plain = make_engine(pair[0], None, method="none", num_speculative_tokens=0, max_seq_len=64)
    plain.controller = Controller(plain.spec, None, max_batch_size=4)
    assert asked(plain, 1) == [1, MAX_ROUNDS, MAX_ROUNDS]  # the third runs n - 1 - MAX_ROUNDS of them
    adaptive = make_engine(*pair, method="draft_model", max_seq_len=64, controller=FixedK([2]))
    log = asked(adaptive, 1)
    assert log[:STABLE] == [1] * (STABLE - 1) + [ADAPTIVE_ROUNDS] and max(log) == ADAPTIVE_ROUNDS


class TimedK(FixedK):
    """FixedK recording the step time each observed round came with (None: untimed)."""

    def __init__(self, ks):
        super().__init__(ks)
        self.times = []

    def observe(self, k, num_accepted, step_time_s=None, **kw):
        super().observe(k, num_accepted, **kw)
        self.times.append(step_time_s)


def test_rounds_behind_a_prefill_are_not_timed_as_steps(pair):
    """Every round of a dispatch that ran right after a prefill shares its wall time with
    the prefill: none of them reaches the controller as a step time, and the trace marks
    them (`after_prefill`) for the bench's decode-only figures. The rounds of the other
    dispatches are timed. One slot, two requests: two prefills."""
    from dsd_jax.step import MAX_ROUNDS
    ctl = TimedK([0])
    eng = make_engine(pair[0], None, controller=ctl, method="none", num_speculative_tokens=0,
                      max_batch_size=1, max_seq_len=64)
    asked, rounds = eng._policy.rounds, []
    eng._policy.rounds = lambda *a: rounds.append(asked(*a)) or rounds[-1]
    eng.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_tokens=40))
    flags = [t["after_prefill"] for t in eng.stats.trace]
    assert [t is None for t in ctl.times] == flags
    # the first request: one round a dispatch while the second waits; then the second alone,
    # its first dispatch one round too (a lone row's dispatch then runs on: it ends with it)
    assert rounds == [1] * 40 + [1, MAX_ROUNDS, MAX_ROUNDS]
    assert flags == ([True] + [False] * 39) * 2


@pytest.mark.own_programs  # a program compiles inside the run
def test_a_compile_inside_a_run_times_no_round_and_is_no_speed(pair):
    """An engine not warmed up compiles each program at its first use, inside a run: the
    rounds read back across such a compile do not reach the controller as step times (a
    multi-second stall would teach it that K is slow), the trace marks them (`compiled`),
    and `metrics()` counts the run's compiling as `compile_s`, which `tokens_per_s` leaves
    out. Run again, nothing compiles: no round is marked and `compile_s` stays."""
    ctl = TimedK([0, 0, 0, 0, 2])  # K=2's program compiles mid-run, at the fifth dispatch
    eng = make_engine(*pair, controller=ctl, method="draft_model", max_batch_size=1, max_seq_len=64)
    eng._policy.rounds = lambda *a: 1  # one round a dispatch: every dispatch is timed alone
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    eng.generate([[1, 2, 3]], sp)
    trace = list(eng.stats.trace)
    untimed = [t["after_prefill"] or t["compiled"] for t in trace]
    assert [t is None for t in ctl.times] == untimed
    assert any(t["compiled"] and not t["after_prefill"] for t in trace)  # the K=2 switch's
    m = eng.metrics()
    assert 0 < m["compile_s"] < m["wall_s"]
    assert m["tokens_per_s"] == pytest.approx(m["tokens"] / (m["wall_s"] - m["compile_s"]))

    compiled_s, seen = m["compile_s"], len(trace)
    eng.generate([[4, 5]], sp)
    assert eng.metrics()["compile_s"] == compiled_s
    again = list(eng.stats.trace)[seen:]
    assert again and not any(t["compiled"] for t in again)
    assert [t is None for t in ctl.times[seen:]] == [t["after_prefill"] for t in again]


@pytest.mark.own_programs  # a program compiles inside the run
def test_a_compile_in_any_process_leaves_the_round_untimed_in_all(pair):
    """Under several processes the step times go through their agreement (the slowest
    under "allgather"), and their controllers must see the same. A compile goes through it
    as an infinite time, so one in any process leaves the round untimed in every one; a
    round behind a prefill (the same in all) goes as None, as before. The stand-in
    agreement plays another process that compiled at every third timed round."""
    import math

    class Agreed:
        def __init__(self):
            self.sent, self.returned = [], []

        def k(self, decide):
            return decide()

        def step_time(self, seconds):
            self.sent.append(seconds)
            other_compiled = seconds is not None and len(self.sent) % 3 == 0
            self.returned.append(math.inf if other_compiled else seconds)
            return self.returned[-1]

    ctl = TimedK([0, 0, 0, 0, 2])
    eng = make_engine(*pair, controller=ctl, method="draft_model", max_batch_size=1, max_seq_len=64)
    eng._policy.agreement = agreed = Agreed()
    eng._policy.rounds = lambda *a: 1
    eng.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    trace = list(eng.stats.trace)
    assert [s is None for s in agreed.sent] == [t["after_prefill"] for t in trace]
    assert [s == math.inf for s in agreed.sent] == [t["compiled"] and not t["after_prefill"] for t in trace]
    assert any(s == math.inf for s in agreed.sent)
    assert [t is None for t in ctl.times] == [r is None or r == math.inf for r in agreed.returned]


@pytest.mark.parametrize("top", [0, 3])
def test_packed_round_outputs_come_back_exactly(top):
    """`step.pack_rounds` / `unpack_rounds`: every field bit for bit (logprobs -inf and
    subnormal included), only the rounds that ran, and the count; with and without top
    logprobs (N = `top`)."""
    from dsd_jax.step import StepOutput, pack_rounds, unpack_rounds
    rng = np.random.default_rng(0)
    R, B, K1, ran = 6, 3, 4, 4
    lp = rng.normal(size=(R, B, K1)).astype(np.float32)
    lp[0, 0, 0], lp[1, 2, 3] = -np.inf, np.float32(1e-42)
    top_lp = rng.normal(size=(R, B, K1, top)).astype(np.float32)
    outs = StepOutput(rng.integers(0, 50_000, (R, B, K1)).astype(np.int32),
                      rng.integers(0, K1 + 1, (R, B)).astype(np.int32),
                      rng.integers(0, K1, (R, B)).astype(np.int32), rng.random((R, B)) < 0.5,
                      lp, -lp, top_lp, rng.integers(0, 50_000, (R, B, K1, top)).astype(np.int32))
    back, n = unpack_rounds(np.asarray(pack_rounds(jax.tree.map(jax.numpy.asarray, outs), ran)))
    assert n == ran
    for name, want, got in zip(StepOutput._fields, outs, back):
        assert got.dtype == want.dtype and got.shape == (ran, B, *want.shape[2:]), name
        np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8),
                                      np.ascontiguousarray(want[:ran]).view(np.uint8), err_msg=name)


def test_goodput_settled_on_k0_runs_long_dispatches_but_not_across_processes(pair):
    """Where K=1 never pays (a goodput controller settled on K=0) a dispatch may run
    MAX_ROUNDS at once; under several processes (`agreement`) a goodput controller's
    own state must not decide the rounds every process asks for."""
    from dsd_jax.config import DynamicConfig
    from dsd_jax.controller import Controller
    from dsd_jax.dispatch import DispatchPolicy
    from dsd_jax.profile import Profile
    from dsd_jax.step import MAX_ROUNDS
    eng = make_engine(*pair, method="draft_model", max_seq_len=64, num_speculative_tokens=1)
    profile = Profile("cpu", [1, 2, 4], [0, 1], [[10.0, 30.0]] * 3, [0.1])
    spec = SpecConfig(method="draft_model", num_speculative_tokens=1,
                      dynamic=DynamicConfig(profile=None, warmup_steps=0, objective="throughput"))
    eng.controller = Controller(spec, profile, max_batch_size=4)
    live = eng._make_requests(eng._check_call([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=40)))
    assert eng.controller.settled(1, 0) and eng._policy.rounds(live, 0, False, None, 1, 3, False) == MAX_ROUNDS
    # as under jax.distributed (an `agreement`): the controllers need not agree
    apart = DispatchPolicy(eng.controller, eng.max_k, object(), eng._budget)
    assert apart.rounds(live, 0, False, None, 1, 3, False) == 1  # not settled: three equal choices first


def test_the_k_goodput_holds_needs_no_three_equal_choices(pair):
    """At the K a goodput controller holds (K = 0 too) a dispatch needs no three equal
    choices: a lone row runs past its length limit (the dispatch ends with it),
    ADAPTIVE_ROUNDS at once; several rows run up to HELD_ROUNDS within the length rule. A
    probe (a K the controller does not hold), a queue, the dispatch after a prefill, stop
    strings and several processes keep the rule before it."""
    from dsd_jax.config import DynamicConfig
    from dsd_jax.controller import Controller
    from dsd_jax.dispatch import ADAPTIVE_ROUNDS, HELD_ROUNDS, DispatchPolicy
    from dsd_jax.profile import Profile
    eng = make_engine(*pair, method="draft_model", max_seq_len=64, num_speculative_tokens=1)
    profile = Profile("cpu", [1, 2, 4], [0, 1], [[10.0, 11.0]] * 3, [0.9])
    spec = SpecConfig(method="draft_model", num_speculative_tokens=1,
                      dynamic=DynamicConfig(profile=None, warmup_steps=0, objective="throughput"))
    eng.controller = Controller(spec, profile, max_batch_size=4)
    assert eng.controller.choose_k(1) == 1 and eng.controller.current_k == 1
    sp = SamplingParams(temperature=0.0, max_tokens=3)  # shorter than the rounds: runs on
    one = eng._make_requests(eng._check_call([[1, 2, 3]], sp))
    two = eng._make_requests(eng._check_call([[1, 2, 3], [4, 5]], sp))
    long = SamplingParams(temperature=0.0, max_tokens=2 * HELD_ROUNDS + 8)  # more than the rounds need at K=1
    two_long = eng._make_requests(eng._check_call([[1, 2, 3], [4, 5]], long))
    stopping = eng._make_requests(eng._check_call([[1, 2, 3], [4, 5]], long))
    for r in stopping:  # (this engine has no tokenizer to check stop strings against)
        r.params = dataclasses.replace(r.params, stop=("x",))
    policy = eng._policy
    assert policy.rounds(one, 1, False, None, 1, 3, False) == ADAPTIVE_ROUNDS
    assert policy.rounds(one, 1, False, None, 1, 3, True) == 1  # right after a prefill
    assert policy.rounds(one, 1, True, None, 1, 3, False) == 1  # a request queued
    policy.begin_run()
    assert policy.rounds(two_long, 1, False, None, 2, 3, False) == HELD_ROUNDS
    assert policy.rounds(two, 1, False, None, 2, 3, False) == 2  # 3 tokens left, 2 a round at most
    policy.begin_run()
    assert policy.rounds(stopping, 1, False, None, 2, 3, False) == 1  # stop strings: three equal choices first
    eng.controller._cur = 0  # K=1 is now a probe off a held K=0
    policy.begin_run()
    assert policy.rounds(one, 1, False, None, 1, 3, False) == 1
    assert policy.rounds(two_long, 1, False, None, 2, 3, False) == 1
    # the held K=0 itself (not `settled`: the goodput row beats it, as a makespan row may)
    assert not eng.controller.settled(2, 0, 3)
    assert policy.rounds(one, 0, False, None, 1, 3, False) == ADAPTIVE_ROUNDS
    assert policy.rounds(two_long, 0, False, None, 2, 3, False) == HELD_ROUNDS
    assert policy.rounds(two, 0, False, None, 2, 3, False) == 3  # 3 tokens left, 1 a round
    eng.controller._cur = 1
    apart = DispatchPolicy(eng.controller, eng.max_k, object(), eng._budget)  # as under jax.distributed
    assert apart.rounds(one, 1, False, None, 1, 3, False) == 1
    assert apart.rounds(two_long, 1, False, None, 2, 3, False) == 1


def test_engine_assigned_seeds_stay_off_the_seeds_users_pick():
    """An unseeded request drew from seed engine_seed * 1_000_003 + request id, so on a fresh
    engine it sampled exactly as a request with seed=1. Engine seeds are now a hash:
    reproducible per engine seed, distinct, and not small integers."""
    from dsd_jax.request import engine_seed
    seeds = [engine_seed(0, rid) for rid in range(2000)]
    assert seeds == [engine_seed(0, rid) for rid in range(2000)]
    assert len(set(seeds)) == len(seeds) and min(seeds) >= 2 ** 16 and max(seeds) < 2 ** 32
    assert set(seeds).isdisjoint(engine_seed(1, rid) for rid in range(2000))


def dispatched_buckets(engine) -> list[int]:
    """The batch bucket of every step program `engine` dispatches from now on, in order."""
    ran, step = [], engine.programs.step

    def recording_step(k, b):
        ran.append(b)
        return step(k, b)

    engine.programs.step = recording_step
    return ran


def test_round_times_are_credited_to_the_bucket_their_program_ran(pair):
    """A dispatch is launched before the one ahead of it is read back, so it runs at the
    bucket of rows that may just have finished, and rows finish inside multi-round
    dispatches: every round's time goes to the program's bucket (the controller's latency
    learning and the trace), not to the bucket of the rows still live."""
    from dsd_jax.buckets import bucket_for
    engine = make_engine(*pair, method="draft_model", max_seq_len=64, batch_buckets=[1, 2, 4],
                         num_speculative_tokens=2)
    ran, credited = dispatched_buckets(engine), []

    class Recorder(FixedK):
        def observe(self, k, num_accepted, step_time_s=None, request_ids=None, context_len=None,
                    batch_size=None):
            credited.append(batch_size)

    engine.controller = Recorder([2])
    engine.generate([[1, 2, 3, 4, 5]] * 3, [SamplingParams(temperature=0.0, max_tokens=m) for m in (3, 9, 20)])
    trace = engine.stats.trace
    assert credited == [t["bucket"] for t in trace]
    assert set(credited) <= set(ran) and all(t["context"] >= 5 for t in trace)
    assert any(t["bucket"] > bucket_for(t["batch_size"], [1, 2, 4]) for t in trace)  # the case that was wrong


def test_one_live_row_runs_in_the_bucket_its_profile_finds_faster(pair):
    """A profile timing one row slower than two at every cell (an H200's one-row matmuls)
    makes the engine run a lone request in the two-row program, with the same tokens; two
    requests, then one left, stay in that program too. A controller naming a bucket the
    engine did not compile fails loudly."""
    from dsd_jax import DynamicConfig
    from dsd_jax.controller import Controller
    from dsd_jax.profile import Profile
    spec = SpecConfig(method="draft_model", num_speculative_tokens=2, dynamic=DynamicConfig(warmup_steps=0))
    prof = Profile("cpu", [1, 2, 4], [0, 1, 2], [[9.0, 9.5, 10.0], [5.0, 5.1, 5.2], [6.0, 6.1, 6.2]],
                   [0.9, 0.8])
    eng = make_engine(*pair, controller=Controller(spec, prof, max_batch_size=4, batch_buckets=[1, 2, 4]),
                      method="draft_model", num_speculative_tokens=2, max_seq_len=64, batch_buckets=[1, 2, 4])
    ran = dispatched_buckets(eng)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    got = eng.generate([[1, 2, 3, 4, 5]], params)
    assert set(ran) == {2}
    assert got[0].token_ids == greedy_reference(pair[0], [1, 2, 3, 4, 5], 12)
    ran.clear()
    eng.generate([[1, 2, 3], [4, 5, 6, 7]], [SamplingParams(temperature=0.0, max_tokens=m) for m in (3, 10)])
    assert set(ran) == {2}
    eng.controller.serving_bucket = lambda n: 3
    with pytest.raises(RuntimeError, match="batch bucket 3 for 1 live rows"):
        eng.generate([[1, 2, 3]], params)


def test_set_params_keeps_weights_of_its_own_and_names_what_differs(engine, pair):
    """The usual RL loop: sync the policy, then a jitted training step donates its params.
    The engine kept the caller's arrays and its next generate failed ("Array has been
    deleted"); now it copies unless told not to. A refused call changes nothing and names
    the leaf; a pure dict of the state is taken."""
    from flax import nnx
    target, draft = pair
    engine.controller = FixedK([2])
    prompt, greedy = [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=6)
    new = scaled(target, 1.3)
    want = greedy_reference(new, prompt[0], 6)
    try:
        params = jax.tree.map(jax.numpy.copy, nnx.state(new))  # `scaled` shares target's norms
        engine.set_params(target=params)
        jax.jit(lambda p: jax.tree.map(lambda x: x * 2, p), donate_argnums=0)(params)
        assert all(x.is_deleted() for x in jax.tree.leaves(params))  # the caller's are gone
        assert engine.generate(prompt, greedy)[0].token_ids == want

        shared = nnx.state(scaled(target, 1.3))
        engine.set_params(target=shared, copy=False)  # the caller's buffers, no copy
        ptr = lambda t: [x.unsafe_buffer_pointer() for x in jax.tree.leaves(t)]
        assert ptr(engine._target_params) == ptr(shared)

        engine.set_params(target=nnx.to_pure_dict(nnx.state(new)))
        assert engine.generate(prompt, greedy)[0].token_ids == want

        pure = nnx.to_pure_dict(nnx.state(target))
        norm = pure["final_norm"]
        for change, match in [
                (lambda d: d.update(final_norm=norm[:-1]),
                 rf"new target param 'final_norm' is float32\[{norm.size - 1}\]; the engine's is "
                 rf"float32\[{norm.size}\]"),
                (lambda d: d.update(final_norm=norm.astype("bfloat16")), r"'final_norm' is bfloat16"),
                (lambda d: d.pop("final_norm"), r"missing \['final_norm'\]"),
                (lambda d: d.update(extra=norm), r"unexpected \['extra'\]"),
                (lambda d: d.update(final_norm="w"), r"'final_norm' is a str, not an array")]:
            bad = dict(pure)
            change(bad)
            with pytest.raises(ValueError, match=match):
                engine.set_params(target=bad)
        with pytest.raises(ValueError, match=r"new target params do not have the engine's leaves"):
            engine.set_params(target=nnx.state(draft))  # the draft's tree given as the target
        with pytest.raises(ValueError, match=r"new target model's config differs from the engine's: "
                                             r"hidden_size 16 \(engine: 32\)"):
            engine.set_params(target=draft)
        # Same shapes, another function: the engine runs its own graph, so this was silently
        # served with the engine's rope_theta and norm epsilon.
        import dataclasses
        other = type(target)(dataclasses.replace(target.config, rope_theta=5e5, rms_norm_eps=1e-3),
                             rngs=nnx.Rngs(0))
        with pytest.raises(ValueError, match=r"rope_theta 500000.0 \(engine: 10000.0\); rms_norm_eps"):
            engine.set_params(target=other)
        engine.set_params(target=nnx.state(other))  # the state alone is the caller's to vouch for
        engine.set_params(target=new)
        before = engine._target_params
        with pytest.raises(ValueError, match="new draft param"):  # the target is not swapped in
            engine.set_params(target=target, draft={**nnx.to_pure_dict(nnx.state(draft)),
                                                    "final_norm": np.zeros(3, np.float32)})
        assert engine._target_params is before
        assert engine.generate(prompt, greedy)[0].token_ids == want
    finally:
        engine.set_params(target=target, draft=draft)


def test_spec_may_be_any_mapping(pair):
    import types
    spec = types.MappingProxyType({"method": "ngram", "num_speculative_tokens": 2})
    engine = SpecEngine(pair[0], None, spec, max_batch_size=1, max_seq_len=16)
    assert engine.spec == SpecConfig(method="ngram", num_speculative_tokens=2)
    with pytest.raises(TypeError, match="spec must be a SpecConfig or a mapping of its fields"):
        SpecEngine(pair[0], None, "ngram", max_batch_size=1, max_seq_len=16)


def test_reset_metrics_mid_stream_zeroes_the_counts_and_keeps_what_the_controller_learnt(engine, pair):
    from dsd_jax.controller import Controller
    old = engine.controller
    engine.controller = Controller(SpecConfig(method="draft_model", num_speculative_tokens=2),
                                   max_batch_size=engine.max_batch_size, batch_buckets=engine.batch_buckets)
    try:
        engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=6))
        assert engine.metrics()["controller"]["steps_observed"] > 0
        got = {}
        for n, (index, new) in enumerate(engine.stream([[1, 2, 3], [4]],
                                                       SamplingParams(temperature=0.0, max_tokens=7))):
            got.setdefault(index, []).extend(new)
            if n == 0:  # between a stream's tokens: the run goes on
                learnt = engine.controller.acceptance_estimate().copy()
                assert not np.isnan(learnt).all()
                engine.reset_metrics()
                m = engine.metrics()
                assert (m["steps"], m["tokens"], m["wall_s"]) == (0, 0, 0.0)
                ctl = m["controller"]
                assert ctl["steps_observed"] == ctl["spec_steps_observed"] == 0  # (the second stayed)
                assert ctl["probes"] == 0 and ctl["itl_mape"] is None
                assert set(ctl["k_choices"].values()) == {0} and set(ctl["k_steps"].values()) == {0}
                np.testing.assert_array_equal(engine.controller.acceptance_estimate(), learnt)
        assert got[0] == greedy_reference(pair[0], [1, 2, 3], 7)
        assert got[1] == greedy_reference(pair[0], [4], 7)
        m = engine.metrics()
        assert m["steps"] > 0 and m["wall_s"] > 0 and m["controller"]["steps_observed"] > 0
    finally:
        engine.controller = old


def test_the_host_time_in_the_controller_is_counted(engine):
    """`controller_s` holds the host time of every choice of K and every observed round (a
    cost dynamic pays and a fixed K hardly does), and no more than the run's wall time."""
    import time as clock

    class Slow(FixedK):  # each call takes at least 1 ms
        def choose_k(self, *a, **kw):
            clock.sleep(1e-3)
            return super().choose_k(*a, **kw)

        def observe(self, *a, **kw):
            clock.sleep(1e-3)
            super().observe(*a, **kw)

    old = engine.controller
    engine.controller = ctl = Slow([2, 1])
    try:
        engine.reset_metrics()
        engine.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_tokens=6))
        m = engine.metrics()
        assert 1e-3 * (ctl.calls + len(ctl.observed)) <= m["controller_s"] <= m["wall_s"]
        assert m["controller_ms_per_step"] == pytest.approx(m["controller_s"] * 1e3 / m["steps"])
        engine.reset_metrics()
        assert engine.metrics()["controller_s"] == 0.0 and engine.metrics()["controller_ms_per_step"] is None
    finally:
        engine.controller = old


def test_refused_calls_and_unstarted_streams_shift_no_later_seed(pair):
    """Unseeded requests draw from a hash of their request id: ids are taken only once a
    call is accepted and its run starts, so a refused call or a stream never iterated
    leaves the next call's tokens as a fresh engine's."""
    sp = SamplingParams(temperature=1.0, max_tokens=6, n=2)
    prompts = [[1, 2], [3]]

    def run(before):
        engine = make_engine(*pair, method="draft_model", max_seq_len=48, controller=FixedK([2]))
        before(engine)
        return [o.token_ids for o in engine.generate(prompts, sp)]

    def refused(engine):
        with pytest.raises(ValueError, match="prompt 1 is empty"):
            engine.generate([[1, 2], []], sp)

    def while_running(engine):
        stream = engine.stream(prompts, sp)
        next(stream)
        with pytest.raises(RuntimeError, match="already running"):
            engine.generate(prompts, sp)
        second = engine.stream(prompts, sp)
        with pytest.raises(RuntimeError, match="already running"):
            next(second)
        stream.close()

    fresh = run(lambda engine: None)
    assert run(refused) == fresh
    assert run(lambda engine: engine.stream(prompts, sp)) == fresh
    once = run(lambda engine: engine.generate(prompts, sp))  # a call that ran takes its ids ...
    assert once != fresh
    assert run(while_running) == once  # ... and refused ones none


def test_a_state_too_large_for_memory_names_its_sizes_and_capped_max_tokens_warn_once(pair):
    with pytest.warns(UserWarning, match="max_position_embeddings"):
        with pytest.raises(MemoryError, match=r"max_seq_len 8589934592 \+ max K 4 \+ 1.*Lower "
                                              r"max_seq_len or max_batch_size"):
            make_engine(*pair, method="draft_model", max_seq_len=2 ** 33)
    engine = make_engine(*pair, method="draft_model", max_seq_len=16, controller=FixedK([2]))
    sp = SamplingParams(temperature=0.0, max_tokens=30)
    with pytest.warns(UserWarning, match=r"1 request\(s\) \(first: prompt 0\).*max_seq_len 16"):
        out = engine.generate([[1, 2, 3]], sp)
    assert (len(out[0].token_ids), out[0].finish_reason) == (13, "length")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per engine
        engine.generate([[1, 2, 3]], sp)


def test_a_prompt_that_is_not_valid_text_is_named(engine):
    """A lone surrogate ("\\ud800", valid in a JSON string) is no text a tokenizer takes."""
    import types
    old, engine.tokenizer = engine.tokenizer, types.SimpleNamespace(encode=lambda text: [1, 2])
    try:
        with pytest.raises(ValueError, match=r"prompt 1: not valid UTF-8 text \(a lone surrogate '\\ud800' "
                                              r"at character 1\)$"):
            engine.generate(["ok", "a\ud800"], SamplingParams(max_tokens=2))
        with pytest.raises(ValueError, match=r"reference 0 of prompt 0: not valid UTF-8 text"):
            engine.generate(["ok"], SamplingParams(max_tokens=2), references=[["\udfff"]])
    finally:
        engine.tokenizer = old


def test_references_to_a_method_that_reads_none_warn_once(pair):
    from dsd_jax.rollout_memory import RolloutMemory
    engine = make_engine(*pair, method="draft_model", max_seq_len=48, controller=FixedK([2]))
    sp = SamplingParams(temperature=0.0, max_tokens=3)
    with pytest.warns(UserWarning, match="method 'draft_model' drafts without references"):
        engine.generate([[1, 2]], sp, references=[[[1, 2, 3]]])
    memory = RolloutMemory()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per engine
        out = engine.generate([[1, 2]], sp, memory=memory)
    assert memory.references([1, 2]) == [out[0].token_ids]  # the memory still stores them


def test_the_step_trace_keeps_the_newest_steps_only(monkeypatch, tmp_path):
    """The trace grew by ~0.5 KB every round until `reset_metrics()`: an RL loop running
    millions of steps held gigabytes. It keeps the newest TRACE_LIMIT steps; the counts
    still cover every step."""
    import json

    from dsd_jax import metrics
    monkeypatch.setattr(metrics, "TRACE_LIMIT", 5)
    stats = metrics.EngineStats(2)
    stats.begin_run()
    for i in range(12):
        stats.record_step(1, 2, np.array([1, 0]), 3, float(i))
    assert stats.steps == 12 and stats.tokens == 36
    assert [t["step"] for t in stats.trace] == [8, 9, 10, 11, 12]
    with pytest.warns(UserWarning, match=r"the trace keeps the newest 5 steps: the 7 steps before them are not in"):
        stats.save_trace(tmp_path / "trace.json")  # (it had dropped them silently)
    assert [t["step"] for t in json.loads((tmp_path / "trace.json").read_text())] == [8, 9, 10, 11, 12]


def test_a_callers_x64_mode_changes_nothing(pair):
    """Notebooks often turn on jax_enable_x64: the programs were traced under it and the
    first generate died in an int32/int64 concatenate. They trace in 32 bits whatever the
    caller's mode, and the tokens are the 32-bit engine's."""
    prompts = [[1, 2, 3], [4, 5]]
    params = [SamplingParams(temperature=0.0, max_tokens=8), SamplingParams(temperature=1.0, max_tokens=8, seed=3)]
    want = [o.token_ids for o in make_engine(*pair, method="draft_model", num_speculative_tokens=3)
            .generate(prompts, params)]
    with jax.enable_x64(True):
        engine = make_engine(*pair, method="draft_model", num_speculative_tokens=3)
        assert [o.token_ids for o in engine.generate(prompts, params)] == want
        assert [t for _, new in engine.stream(prompts[:1], params[0]) for t in new] == want[0]


def test_the_controller_hears_when_a_run_ends(engine):
    """The dispatch launched behind a batch's last rows (or an abandoned stream's) is
    dropped unobserved: `end_run` tells the controller its choice for it will never come
    back (a goodput controller otherwise kept waiting for a probe's result)."""
    class Recorder(FixedK):
        ended = 0

        def end_run(self):
            self.ended += 1

    engine.controller = rec = Recorder([2])
    engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=3))
    stream = engine.stream([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=8))
    next(stream)
    stream.close()
    assert rec.ended == 2


def test_an_abandoned_stream_leaves_no_per_request_state_in_the_controller(pair):
    """A finished request's rows are dropped from the controller (`forget_request`); the
    unfinished requests of a stream closed early, or of a run that raised, kept theirs for
    good (their ids never come back: 16 rows after one such stream, 480 after 30)."""
    from dsd_jax import DynamicConfig
    from dsd_jax.controller import Controller
    from dsd_jax.profile import Profile
    spec = SpecConfig(method="draft_model", num_speculative_tokens=2, dynamic=DynamicConfig(warmup_steps=0))
    # speculation cheap and accepted: K > 0 from the start, so finished requests teach the spread
    prof = Profile("cpu", [1, 2, 4], [0, 1, 2], [[5.0, 5.1, 5.2], [5.5, 5.6, 5.7], [6.0, 6.1, 6.2]], [0.9, 0.8])
    eng = make_engine(*pair, controller=Controller(spec, prof, max_batch_size=4), method="draft_model",
                      num_speculative_tokens=2, max_seq_len=32)
    assert eng.controller.objective == "makespan"  # it tracks the live requests' rows
    eng.generate([[1, 2, 3], [4, 5], [6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=16))
    learnt = eng.controller._requests._moments.copy()
    assert learnt.any()  # finished requests taught the spread between requests
    for _ in range(3):
        s = eng.stream([[1, 2, 3]] * 6, SamplingParams(temperature=0.0, max_tokens=8))
        next(s)
        assert eng.controller._requests.row_of  # the live requests' rows
        s.close()
    assert eng.controller._requests.row_of == {}
    # and the unfinished ones taught it nothing (forgotten as finished, they had aged it)
    assert (eng.controller._requests._moments == learnt).all()


def test_on_output_hands_each_request_over_as_it_finishes(engine):
    """`generate(on_output=)`: every request once, with its index in the returned list and an
    output equal to the one returned (a batch script keeps what is done before it returns)."""
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 12]]  # more than the 4 slots
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in (9, 2, 5, 7, 3)]
    seen = []
    outs = engine.generate(prompts, params, return_logprobs=True, on_output=lambda i, o: seen.append((i, o)))
    assert sorted(i for i, _ in seen) == list(range(5)) and [i for i, _ in seen] != list(range(5))
    assert all(o == outs[i] for i, o in seen)
