"""In-process profiler: latency table, acceptance, fingerprints, engine left intact."""

from __future__ import annotations

import json
import math
import warnings

import jax
import numpy as np
import pytest

from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax import profiler as prof_lib
from dsd_jax.profile import Profile, ProfileMismatchWarning
from conftest import FixedK, scaled

K = 1
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9], [3, 3, 3, 9], [10, 11]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    target, draft = tiny_pair
    return scaled(target, 3.0), draft


@pytest.fixture(scope="module")
def engine(pair):
    return SpecEngine(*pair, SpecConfig(num_speculative_tokens=K), max_batch_size=2, max_seq_len=48,
                      prefill_chunk=16, controller=FixedK([K]))


@pytest.fixture(scope="module")
def run(engine):
    """(outputs before, profile, progress calls, outputs after)."""
    before = [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]
    ctl, stats = engine.controller, engine.stats
    calls = []
    prof = prof_lib.profile_engine(engine, context_lengths=(24, 8), repeats=3, warmup_reps=1, passes=2,
                                   prompts=PROMPTS, acceptance_max_tokens=10,
                                   temperatures=(0.0, 1.0), progress=lambda d, t: calls.append((d, t)))
    assert engine.controller is ctl and engine.stats is stats  # restored
    after = [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]
    return before, prof, calls, after


def test_latency_table_shape_and_positive(run, engine):
    _, prof, _, _ = run
    assert prof.batch_sizes == list(engine.batch_buckets) == [1, 2]
    assert prof.ks == list(range(K + 1))
    assert prof.context_lengths == [8, 24]
    table = np.asarray(prof.latency_ms)
    assert table.shape == (2, 2, K + 1)
    assert np.all(np.isfinite(table)) and np.all(table > 0)
    assert prof.device_kind == jax.devices()[0].device_kind
    assert prof.platform == jax.devices()[0].platform and prof.jax_version == jax.__version__
    assert prof.method == "draft_model"
    m = prof.meta
    assert m["context_lengths"] == [8, 24] and m["repeats"] == 3 and m["passes"] == 2 and m["rounds_per_sample"] == 4 and m["num_prompts"] == len(PROMPTS)
    assert m["engine"]["max_seq_len"] == 48 and m["engine"]["batch_buckets"] == [1, 2]
    assert m["engine"]["kernel_backends"] == {"attention": "xla", "rejection": "xla"}
    # the stored table is the fit of the raw medians kept in meta. Whether the one-row bucket
    # keeps a row of its own (served by the two-row one) follows the timings, which a loaded
    # CPU can invert (two rows measured 8-15% faster than one in a full run under xdist), so
    # only the order along K is fixed here
    raw = np.asarray(m["latency_ms_raw"])
    assert raw.shape == table.shape and np.all(raw > 0)
    np.testing.assert_allclose(table, prof_lib.profile_latency(raw, [1, 2]))
    assert np.all(np.diff(table, axis=2) >= 0)


def test_monotone_latency_fit():
    measured = [5.6, 7.4, 8.5, 9.3, 9.3, 9.9, 8.4]  # a noisy B=1 row: K=6 timed below K=5
    fit = prof_lib.monotone_latency([[measured]])[0, 0]
    np.testing.assert_allclose(fit, [5.6, 7.4, 8.5] + [np.mean(measured[3:])] * 4)
    ok = np.cumsum(np.cumsum(np.random.default_rng(0).uniform(0.1, 1.0, (2, 4, 5)), axis=2), axis=1)
    np.testing.assert_array_equal(prof_lib.monotone_latency(ok), ok)  # already monotone: unchanged
    noisy = ok * np.random.default_rng(1).uniform(0.7, 1.3, ok.shape)
    fit = prof_lib.monotone_latency(noisy)
    assert np.all(np.diff(fit, axis=2) >= 0) and np.all(np.diff(fit, axis=1) >= 0)
    # a least-squares fit stays near the data: no worse than the data's own distance to truth
    assert np.linalg.norm(fit - ok) <= np.linalg.norm(noisy - ok)


def test_profile_latency_keeps_a_bucket_a_larger_one_beats_everywhere():
    """An H200 timed a one-row forward 1.36x as long as a two-row one. Fit monotone along B,
    that row would be pooled with the next and the inversion lost; kept, the controller
    serves one row in the two-row bucket (`buckets.serving_buckets`). A small inversion
    (within SERVE_MARGIN: noise) is still smoothed away."""
    from dsd_jax.buckets import serving_buckets
    raw = np.array([[[6.9, 6.7, 8.4, 10.0], [5.3, 6.0, 7.5, 9.0], [5.9, 7.6, 9.0, 10.5]]])
    fit = prof_lib.profile_latency(raw, [1, 2, 16])
    np.testing.assert_array_equal(fit[:, 1:], prof_lib.monotone_latency(raw[:, 1:]))
    np.testing.assert_allclose(fit[0, 0], [6.8, 6.8, 8.4, 10.0])  # its own row, monotone in K
    assert serving_buckets(fit, [1, 2, 16]) == {1: 2}
    text = prof_lib.format_profile(Profile("gpu", [1, 2, 16], [0, 1, 2, 3], fit[0].tolist(), [0.7, 0.4, 0.2]))
    assert "batch bucket 1 is slower than bucket 2 at every context and K" in text
    assert np.all(prof_lib.monotone_latency(raw)[0, 0] <= prof_lib.monotone_latency(raw)[0, 1])  # pooled
    near = raw.copy()
    near[0, 0] = raw[0, 1] * 1.04                   # 4% slower than two rows: noise, pooled
    np.testing.assert_array_equal(prof_lib.profile_latency(near, [1, 2, 16]), prof_lib.monotone_latency(near))


def test_paired_cells_cancel_a_rep_wide_slowdown():
    """A slow stretch that hits every K of one rep moves no K/K0 ratio; separate medians would."""
    truth = np.array([3.0, 4.5, 5.0, 6.0])
    slow = np.array([1.0, 1.4, 1.0, 1.4, 1.4])  # 3 of 5 reps slow: every K's median is slow
    samples = slow[:, None] * truth[None, :]
    cells = prof_lib.paired_cells(samples)
    np.testing.assert_allclose(cells / cells[0], truth / truth[0])
    np.testing.assert_allclose(cells[0], 1.4 * truth[0])
    # leading axes (context, bucket) are kept; a K slower in every rep moves its own ratio only
    noisy = np.stack([samples, samples * np.array([1.0, 1.0, 1.2, 1.0])])
    cells = prof_lib.paired_cells(noisy)
    assert cells.shape == (2, 4)
    np.testing.assert_allclose(cells[1] / cells[1, 0], truth / truth[0] * [1, 1, 1.2, 1])


def test_progress_reports_every_cell(run):
    _, _, calls, _ = run
    total = 2 * 2 * 2 * (K + 1) + 2  # cells in each of 2 passes + one acceptance run per temperature
    assert calls == [(i, total) for i in range(1, total + 1)]


def test_engine_left_usable_and_unchanged(run, engine):
    before, _, _, after = run
    assert before == after
    assert not bool(np.asarray(engine.state.active).any())


def test_acceptance_matches_engine_statistics(run, engine):
    """a_i from the profiler equals accepted/proposed counted by the engine at K = max_k."""
    _, prof, _, _ = run
    assert set(prof.acceptance_by_temperature) == {"0.0", "1.0"}
    assert prof.acceptance == prof.acceptance_by_temperature["0.0"]
    engine.controller = FixedK([K])
    engine.stats.reset()
    engine.generate(PROMPTS, [SamplingParams(temperature=0.0, max_tokens=10, seed=i)
                              for i in range(len(PROMPTS))])
    assert engine.stats.acceptance_per_position() == pytest.approx(prof.acceptance, abs=1e-12)
    rows = prof.meta["acceptance_rows_observed"]["0.0"]
    assert rows == engine.stats.proposed_per_pos[0]


def test_recorder_counts_unconditional_acceptance():
    rec = prof_lib._AcceptanceRecorder(3)
    rec.observe(3, np.array([0, 1, 3, 2]))
    rec.observe(3, np.array([3]))
    rec.observe(0, np.array([0, 0]))  # not a max-K step: ignored
    assert rec.acceptance() == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    assert prof_lib._AcceptanceRecorder(2).choose_k(7) == 2
    with pytest.raises(RuntimeError):
        prof_lib._AcceptanceRecorder(2).acceptance()


def test_round_trip_and_compatibility(run, engine, tmp_path):
    _, prof, _, _ = run
    path = tmp_path / "p.json"
    prof.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = Profile.load(path, expect_fingerprints=engine.fingerprints(),
                              expect_device_kind=prof_lib.device_kind())
    assert loaded.to_dict() == prof.to_dict()
    with pytest.warns(ProfileMismatchWarning, match="fingerprint mismatch"):
        Profile.load(path, expect_fingerprints={**engine.fingerprints(), "target": "0" * 16 + ".x"})
    with pytest.warns(ProfileMismatchWarning, match="device kind"):
        Profile.load(path, expect_device_kind="TPU v9")


@pytest.mark.parametrize("corrupt, match", [
    (lambda d: d["latency_ms"][0][1].__setitem__(0, 0.0), "positive finite latency"),
    (lambda d: d["latency_ms"][1][0].__setitem__(1, float("nan")), "positive finite latency"),
    (lambda d: d["latency_ms"][0][1].pop(), "missing cells"),
    (lambda d: d["latency_ms"].pop(), "missing cells"),
    (lambda d: d.pop("fingerprints"), "missing key"),
    (lambda d: d["acceptance"].__setitem__(0, 1.5), "probability"),
])
def test_corrupted_profile_is_a_clear_error(run, tmp_path, corrupt, match):
    _, prof, _, _ = run
    d = prof.to_dict()
    corrupt(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))  # NaN is written as the (non-standard) token NaN
    with pytest.raises(ValueError, match=match) as e:
        Profile.load(path)
    assert "bad.json" in str(e.value)


def test_fingerprints(pair, engine):
    target, draft = pair
    fp = prof_lib.model_fingerprint(target)
    assert fp == prof_lib.model_fingerprint(target)  # stable
    assert engine.fingerprints() == {"target": fp, "draft": prof_lib.model_fingerprint(draft)}
    from flax import nnx
    graph, params = nnx.split(target)
    assert prof_lib.model_fingerprint((target.config, params)) == fp
    assert prof_lib.model_fingerprint((target.config, nnx.to_pure_dict(params))) == fp
    other = prof_lib.model_fingerprint(scaled(target, 1.01))
    cfg_part, params_part = fp.split(".")
    assert other.split(".")[0] == cfg_part and other.split(".")[1] != params_part
    assert prof_lib.model_fingerprint((draft.config, params)).split(".")[0] != cfg_part
    with pytest.raises(ValueError):
        prof_lib.model_fingerprint("nope")


def test_argument_validation(engine):
    with pytest.raises(ValueError, match="max_seq_len"):
        prof_lib.profile_engine(engine, context_lengths=(49,))
    with pytest.raises(ValueError, match="context lengths"):
        prof_lib.profile_engine(engine, context_lengths=(0,))
    with pytest.raises(ValueError, match="repeats"):
        prof_lib.profile_engine(engine, repeats=0, context_lengths=(8,))
    with pytest.raises(ValueError, match="rounds_per_sample"):
        prof_lib.profile_engine(engine, rounds_per_sample=0, context_lengths=(8,))
    with pytest.raises(ValueError, match="passes"):
        prof_lib.profile_engine(engine, passes=0, context_lengths=(8,))
    with pytest.raises(ValueError, match="temperatures"):
        prof_lib.profile_engine(engine, temperatures=(), context_lengths=(8,))
    with pytest.raises(ValueError, match="acceptance must give"):
        prof_lib.profile_engine(engine, acceptance=[], context_lengths=(8,))  # max_k = 1 values
    with pytest.raises(ValueError, match="acceptance must give"):
        prof_lib.profile_engine(engine, acceptance=[1.5], context_lengths=(8,))
    with pytest.raises(ValueError, match="a_2 = 0.6 exceeds a_1 = 0.2"):
        prof_lib.profile_engine(engine, acceptance=[0.2, 0.6] + [0.1] * K, context_lengths=(8,))


def test_given_acceptance_is_recorded_without_generating(engine, monkeypatch):
    """acceptance= (a published curve, or random weights): latency measured, a_i as given,
    no acceptance run (generate is never called)."""
    monkeypatch.setattr(engine, "generate", lambda *a, **kw: pytest.fail("generated"))
    prof = prof_lib.profile_engine(engine, context_lengths=(8,), repeats=1, warmup_reps=0,
                                   acceptance=[0.7, 0.4, 0.2, 0.1])
    assert prof.acceptance == pytest.approx([0.7, 0.4, 0.2, 0.1][:K])
    assert prof.meta["prompt_source"] == "none (acceptance given)"
    assert np.all(np.asarray(prof.latency_ms) > 0)


def test_catch_up_cell(run, engine):
    """The draft's catch-up round is timed per bucket at the largest context length, with
    the draft admitted one chunk short (the reset leaves it that far behind); at contexts
    shorter than a chunk there is no such round to time."""
    assert run[1].catchup_ms is None  # contexts 8 and 24 < a 32-token chunk
    chunk = engine.drafter.catchup_chunk
    prof = prof_lib.profile_engine(engine, context_lengths=(40,), repeats=1, warmup_reps=0,
                                   acceptance=[0.7, 0.4, 0.2, 0.1][:K])
    c = prof.catchup_ms
    assert c["chunk"] == chunk and len(c["ms"]) == len(engine.batch_buckets)
    assert all(np.isfinite(c["ms"])) and min(c["ms"]) >= 0
    assert f"draft catch-up, one {chunk}-token round a row: B=1 " in prof_lib.format_profile(prof)
    programs = prof_lib._state_programs(engine)
    state = programs.reset(engine.state, np.int32(2), np.int32(40), np.int32(chunk))
    assert np.asarray(state.drafter.length)[:2].tolist() == [40 - chunk - 1] * 2  # the draft holds the rest
    engine.state = programs.idle(state)


def test_failure_mid_profile_leaves_a_working_engine(engine, monkeypatch):
    real = engine.programs.step
    calls = {"n": 0}

    def flaky(k, b):
        exe = real(k, b)

        def run_step(*args):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("boom")
            return exe(*args)
        return run_step

    monkeypatch.setattr(engine.programs, "step", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        prof_lib.profile_engine(engine, context_lengths=(8,), repeats=1, warmup_reps=0)
    monkeypatch.undo()
    engine.controller = FixedK([K])
    outs = engine.generate(PROMPTS[:1], GREEDY)
    assert len(outs[0].token_ids) == GREEDY.max_tokens


def test_format_profile(run):
    _, prof, _, _ = run
    text = prof_lib.format_profile(prof)
    assert "context 8" in text and "context 24" in text and "K=1" in text
    assert not math.isnan(prof.acceptance[0])


def test_every_sample_runs_all_its_rounds_at_the_largest_context(engine, monkeypatch):
    """At context = max_seq_len a K > 0 row has room for one round in the cache (capacity
    max_seq_len + K + 1) and ended the sample early, sharing the dispatch overhead among
    fewer rounds than K = 0's; samples there now start early enough to run every round."""
    ran = []
    unpack = prof_lib.unpack_rounds

    def spy(packed):
        out, rounds = unpack(packed)
        ran.append(rounds)
        return out, rounds

    monkeypatch.setattr(prof_lib, "unpack_rounds", spy)
    prof_lib.profile_engine(engine, context_lengths=(engine.max_seq_len,), repeats=1, warmup_reps=0,
                            passes=1, rounds_per_sample=4, acceptance=[0.5] * K)
    cells = len(engine.batch_buckets) * (K + 1)  # the latency samples (the catch-up's come after)
    assert ran[:cells] == [4] * cells
    assert prof_lib._sample_start(engine, 8, K, 4) == 8  # room to spare: the context itself


def test_batch_size_order_and_deadline_cut_the_table(engine, tmp_path):
    """`batch_sizes` sets the order rows are timed in; past the deadline no row starts but
    the first: the profile holds the batch sizes reached, says what was cut, and loads."""
    import time
    assert list(engine.batch_buckets) == [1, 2]
    prof = prof_lib.profile_engine(engine, context_lengths=(8, 16), repeats=2, warmup_reps=0,
                                   acceptance=[0.5] * K, batch_sizes=(2, 1),
                                   deadline=time.perf_counter() - 1)
    assert prof.batch_sizes == [2]
    assert prof.meta["truncated"] == {"dropped_batch_sizes": [1], "passes_timed": {"2": 1}}
    assert np.asarray(prof.latency_ms).shape == (2, 1, K + 1)
    assert np.all(np.isfinite(prof.latency_ms)) and np.all(np.asarray(prof.latency_ms) > 0)
    prof.save(tmp_path / "cut.json")
    assert Profile.load(tmp_path / "cut.json").batch_sizes == [2]
    full = prof_lib.profile_engine(engine, context_lengths=(8,), repeats=1, warmup_reps=0, passes=1,
                                   acceptance=[0.5] * K, batch_sizes=(2, 1))
    assert full.batch_sizes == [1, 2] and "truncated" not in full.meta
    for bad in ((3,), (2, 2), ()):
        with pytest.raises(ValueError, match="batch_sizes must be distinct batch buckets"):
            prof_lib.profile_engine(engine, context_lengths=(8,), batch_sizes=bad)


def test_paired_cells_leave_out_untimed_reps():
    """A pass the deadline cut leaves NaN samples: the cells are the medians of the rest."""
    timed = np.array([[10.0, 15.0], [12.0, 24.0], [11.0, 22.0]])  # [rep, K]
    cut = np.concatenate([timed, np.full((2, 2), np.nan)])
    assert prof_lib.paired_cells(cut).tolist() == prof_lib.paired_cells(timed).tolist() == [11.0, 22.0]


def test_sampled_acceptance_runs_follow_the_seed():
    """Request i of a sampled acceptance run is seeded seed + i (`dsd-jax profile --seed`
    reached only the synthetic rows and the random prompts)."""
    import contextlib

    class Recording:
        max_k = 2

        def _stand_in(self, controller):
            return contextlib.nullcontext()

        def generate(self, prompts, params):
            self.seeds = [p.seed for p in params]

    engine = Recording()
    with pytest.raises(RuntimeError, match="no speculative step"):  # nothing ran: only the seeds matter
        prof_lib._measure_acceptance(engine, [[1], [2], [3]], 1.0, 4, seed=2 ** 32 - 2)
    assert engine.seeds == [2 ** 32 - 2, 2 ** 32 - 1, 0]
