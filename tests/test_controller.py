"""Controller: modes, goodput argmax, warm-up, forgetting, hysteresis, per-request."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.profile import Profile, ProfileMismatchWarning
from test_acceptance import pinned

BS = [1, 2, 4, 8, 16, 32, 64]


def _forward_ms(tokens):
    """Target forward time vs tokens per forward, as measured on XLA:CPU (DESIGN.md 11)."""
    return float(np.interp(tokens, [1, 8, 32, 256, 4096], [4.6, 5.5, 8.2, 42.0, 42.0 + 0.15 * 3840]))


def realistic_profile(max_k=6, acceptance=(0.8, 0.65, 0.5, 0.4, 0.3, 0.25), ctx=None):
    """Verify reads B * (K + 1) tokens; each draft step costs a little; KV reads grow with B * context."""
    ks = list(range(max_k + 1))

    def cell(b, k, c=0):
        return _forward_ms(b * (k + 1)) + k * (1.2 + 0.04 * b) + 0.002 * c * b / 8

    if ctx is None:
        return Profile("cpu", BS, ks, [[cell(b, k) for k in ks] for b in BS], list(acceptance[:max_k]))
    return Profile("cpu", BS, ks, [[[cell(b, k, c) for k in ks] for b in BS] for c in ctx],
                   list(acceptance[:max_k]), context_lengths=ctx)


def goodput_spec(max_k=6, **dyn):
    return SpecConfig(num_speculative_tokens=max_k, dynamic=DynamicConfig(**dyn))


def brute_goodput(profile, acc, b, ctx, kmax):
    al = 1.0 + np.concatenate([[0.0], np.cumsum(acc[:kmax])])
    return np.array([al[k] / profile.itl_ms(b, k, ctx) for k in range(kmax + 1)])


# ---------------------------------------------------------------- simple modes


def test_none_and_static():
    c = Controller(SpecConfig(method="none"))
    assert [c.choose_k(b) for b in (1, 64, 1000)] == [0, 0, 0]
    c = Controller(SpecConfig(num_speculative_tokens=5), max_batch_size=8)
    assert [c.choose_k(b) for b in (1, 8, 9, 1000)] == [5, 5, 5, 5]
    assert c.choose_k(0) == 0
    assert c.stats()["k_choices"][5] == 4


def test_schedule_vllm_example():
    spec = SpecConfig(num_speculative_tokens=3,
                      num_speculative_tokens_per_batch_size=[[1, 64, 3], [65, 128, 1], [129, 512, 0]])
    for max_b in (512, 64):  # precomputed table and the slow path above max_batch_size
        c = Controller(spec, max_batch_size=max_b)
        assert (c.choose_k(64), c.choose_k(65), c.choose_k(300)) == (3, 1, 0)
        assert (c.choose_k(1), c.choose_k(128), c.choose_k(129), c.choose_k(600)) == (3, 1, 0, 0)
        assert c.choose_k(np.int64(64)) == 3
    gap = SpecConfig(num_speculative_tokens=3, num_speculative_tokens_per_batch_size=[[1, 4, 3], [9, 16, 2]])
    c = Controller(gap, max_batch_size=16)
    assert [c.choose_k(b) for b in (4, 5, 8, 9)] == [3, 0, 0, 2]


def test_disable_by_batch_size_all_modes():
    """K = 0 once the live batch reaches the threshold, as vLLM V0 (`running_queue_size >=
    disable_by_batch_size`): a vLLM config read by `SpecConfig.from_dict` means the same."""
    c = Controller(SpecConfig(num_speculative_tokens=4, disable_by_batch_size=8), max_batch_size=16)
    assert [c.choose_k(b) for b in (1, 7, 8, 9, 16, 100)] == [4, 4, 0, 0, 0, 0]
    spec = SpecConfig(num_speculative_tokens=3, disable_by_batch_size=100,
                      num_speculative_tokens_per_batch_size=[[1, 64, 3], [65, 128, 1], [129, 512, 0]])
    c = Controller(spec, max_batch_size=128)
    assert (c.choose_k(64), c.choose_k(99), c.choose_k(100), c.choose_k(101)) == (3, 1, 0, 0)
    vllm = SpecConfig.from_dict({"model": "draft", "num_speculative_tokens": 4, "speculative_disable_by_batch_size": 4})
    assert [Controller(vllm, max_batch_size=8).choose_k(b) for b in (3, 4, 5)] == [4, 0, 0]
    # goodput: K = 0 at the threshold even where speculation would win.
    spec = SpecConfig(num_speculative_tokens=6, disable_by_batch_size=3, dynamic=DynamicConfig(margin=0.0))
    c = Controller(spec, realistic_profile())
    assert c.choose_k(2) > 0 and c.choose_k(3) == 0 and c.choose_k(1) > 0 and c.choose_k(200) == 0


def test_bad_arguments():
    c = Controller(goodput_spec(), realistic_profile())
    for bad in ("4", 2.5, None, True):
        with pytest.raises(ValueError, match="batch_size"):
            c.choose_k(bad)
    with pytest.raises(ValueError, match="context_len"):
        c.choose_k(4, "long")
    with pytest.raises(ValueError, match="k must be"):
        c.observe(7, [0])
    with pytest.raises(ValueError, match="0..k=2"):
        c.observe(2, [3, 0])
    with pytest.raises(ValueError, match="0..k=2"):
        c.observe(2, [-1])
    with pytest.raises(ValueError, match="1-D"):
        c.observe(2, [[1, 0]])
    with pytest.raises(ValueError, match="integers"):
        c.observe(2, [0.5])
    with pytest.raises(ValueError, match="step_time_s"):
        c.observe(2, [1], step_time_s=float("nan"))
    with pytest.raises(ValueError, match="max_batch_size"):
        Controller(goodput_spec(), realistic_profile(), max_batch_size=0)
    with pytest.raises(ValueError, match="spec"):
        Controller({"num_speculative_tokens": 3})


def test_goodput_needs_profile(tmp_path):
    with pytest.raises(ValueError, match="dynamic.profile"):
        Controller(goodput_spec())
    path = tmp_path / "p.json"
    realistic_profile().save(path)
    c = Controller(goodput_spec(profile=str(path)))  # loaded from dynamic.profile
    assert c.profile.batch_sizes == BS
    with pytest.raises(ValueError, match="nope.json"):
        Controller(goodput_spec(profile=str(tmp_path / "nope.json")))
    with pytest.warns(ProfileMismatchWarning, match="ngram"):
        Controller(SpecConfig(method="ngram", dynamic={}), realistic_profile())


def test_candidates_restricted_to_profile_ks():
    p = realistic_profile(max_k=2, acceptance=(1.0, 1.0))
    c = Controller(goodput_spec(max_k=6, margin=0.0), p)
    assert c.choose_k(1) == 2  # perfect acceptance, but the profile stops at K = 2
    c = Controller(goodput_spec(max_k=1, margin=0.0), realistic_profile(acceptance=(1.0,) * 6))
    assert c.choose_k(1) == 1  # SpecConfig's max K caps it too


# ---------------------------------------------------------------- goodput argmax


@st.composite
def random_profile(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    nb = draw(st.integers(1, 6))
    max_k = draw(st.integers(1, 6))
    nc = draw(st.integers(1, 3))
    bs = sorted(rng.choice(np.arange(1, 80), nb, replace=False).tolist())
    cs = sorted(rng.choice(np.arange(0, 4096), nc, replace=False).tolist())
    table = rng.uniform(1.0, 50.0, (nc, nb, max_k + 1))
    if draw(st.booleans()):  # realistic: monotone in K
        table = np.sort(table, axis=-1)
    acc = np.sort(rng.uniform(0, 1, max_k))[::-1]
    return Profile("cpu", bs, list(range(max_k + 1)), table.tolist(), acc.tolist(), context_lengths=cs)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=random_profile(), spec_k=st.integers(1, 7), data=st.data())
def test_choice_is_bruteforce_argmax(prof, spec_k, data):
    kmax = min(spec_k, prof.max_k)
    max_b = data.draw(st.integers(1, 96))
    b = data.draw(st.integers(1, 120))
    ctx = data.draw(st.one_of(st.none(), st.sampled_from(prof.context_lengths), st.integers(-100, 5000)))
    c = Controller(goodput_spec(max_k=spec_k, margin=0.0), prof, max_batch_size=max_b)
    k = c.choose_k(b, ctx)
    g = brute_goodput(prof, np.asarray(prof.acceptance), b, c.context_bucket(ctx), kmax)
    assert 0 <= k <= kmax
    assert g[k] == pytest.approx(g.max(), rel=1e-12)
    if ctx is None or ctx in prof.context_lengths:  # grid context: the bucket is exact
        assert c.context_bucket(ctx) == (prof.context_lengths[0] if ctx is None else ctx)
    np.testing.assert_allclose(c.predicted_goodput(b, ctx), g, rtol=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=random_profile(), margin=st.floats(0.0, 0.2), seq=st.lists(st.integers(1, 80), min_size=1, max_size=30))
def test_hysteresis_stays_within_margin(prof, margin, seq):
    c = Controller(goodput_spec(max_k=prof.max_k, margin=margin, probe_interval=0), prof, max_batch_size=64)
    for b in seq:
        k = c.choose_k(b)
        g = brute_goodput(prof, np.asarray(prof.acceptance), b, None, prof.max_k)
        assert g[k] * (1 + margin) >= g.max() * (1 - 1e-12)


def test_realistic_profile_regime_change():
    c = Controller(goodput_spec(margin=0.0), realistic_profile())
    ks = [c.choose_k(b) for b in BS]
    assert ks[0] >= 3 and ks[-1] <= 1 and ks == sorted(ks, reverse=True)


def test_context_axis_changes_choice():
    p = realistic_profile(ctx=[0, 8192])
    c = Controller(goodput_spec(margin=0.0), p)
    # Longer context: every K gets a fixed extra cost, which favours more drafts per step.
    assert c.choose_k(16, 8192) >= c.choose_k(16, 0)
    t = np.array(p.latency_ms)
    t[1, :, 1:] *= 3.0  # speculation gets very expensive at long context
    q = Profile("cpu", BS, list(range(7)), t.tolist(), p.acceptance, context_lengths=[0, 8192])
    c = Controller(goodput_spec(margin=0.0), q)
    assert c.choose_k(1, 0) > 0 and c.choose_k(1, 8192) == 0 and c.choose_k(1, 10**6) == 0
    assert c.context_bucket(4096) == 4096 and c.context_bucket(-5) == 0 and c.context_bucket(9999) == 8192


def test_batch_buckets_use_bucket_latency():
    p = Profile("cpu", [1, 8], [0, 1], [[10.0, 11.0], [10.0, 30.0]], [0.9])
    spec = goodput_spec(max_k=1, margin=0.0)
    interp = Controller(spec, p, max_batch_size=8)
    bucketed = Controller(spec, p, max_batch_size=8, batch_buckets=[1, 8])
    # n = 2: interpolated ITL(K=1) = 13.86 -> 1.9/13.86 > 1/10: speculate; bucket 8 -> 1.9/30 < 1/10.
    assert interp.choose_k(2) == 1 and bucketed.choose_k(2) == 0
    with pytest.raises(ValueError, match="batch bucket"):
        Controller(spec, p, max_batch_size=16, batch_buckets=[1, 8])


# ---------------------------------------------------------------- live acceptance


def test_warmup_switches_from_profile_to_live():
    p = realistic_profile(max_k=4, acceptance=(0.8, 0.6, 0.5, 0.4))
    f = 0.25
    c = Controller(goodput_spec(max_k=4, warmup_steps=3, forgetting=f), p)
    prior = np.array(p.acceptance)
    np.testing.assert_array_equal(c.acceptance_estimate(), prior)
    steps = [[4, 0, 1, 2], [3, 3, 0, 1], [1, 2, 4, 4]]
    A, N = np.zeros(4), np.zeros(4)
    for i, acc in enumerate(steps):
        c.observe(0, [0, 0, 0, 0])  # K = 0 steps do not count towards warm-up
        np.testing.assert_array_equal(c.acceptance_estimate(), prior)
        c.observe(4, acc)
        A = (1 - f) * A + (np.asarray(acc)[:, None] >= np.arange(1, 5)).sum(0)
        N = (1 - f) * N + len(acc)
        if i < 2:
            np.testing.assert_array_equal(c.acceptance_estimate(), prior)
            assert not c.stats()["using_live_acceptance"]
    np.testing.assert_allclose(c.acceptance_estimate(), A / N, rtol=1e-12)
    assert c.stats()["using_live_acceptance"] and c.stats()["steps_observed"] == 6


def test_the_prior_follows_the_runs_temperature():
    """A profile measured at several temperatures: each run's prior (`use_temperature`) is the
    acceptance at the closest one, so a sampled rollout does not start from greedy's; what was
    learnt live stays, and a profile of one temperature changes nothing."""
    p = realistic_profile(max_k=4, acceptance=(0.9, 0.8, 0.7, 0.6))
    p.acceptance_by_temperature = {"0.0": [0.9, 0.8, 0.7, 0.6], "1.0": [0.3, 0.1, 0.03, 0.01]}
    c = Controller(goodput_spec(max_k=4, warmup_steps=2), p, max_batch_size=64)
    greedy_k = c.choose_k(1)
    assert greedy_k == 4
    c.use_temperature(0.8)
    np.testing.assert_allclose(c.acceptance_estimate(), [0.3, 0.1, 0.03, 0.01])
    assert c.choose_k(1) < greedy_k and c.predicted_al(4) == pytest.approx(1.44)
    c.use_temperature(0.2)
    np.testing.assert_allclose(c.acceptance_estimate(), p.acceptance)
    assert c.choose_k(1) == greedy_k
    for _ in range(2):  # warm-up done: live counts where rows reached, the prior past them
        c.observe(2, [2, 1, 0, 2])
    live = c.acceptance_estimate()
    c.use_temperature(1.0)
    np.testing.assert_allclose(c.acceptance_estimate()[:2], live[:2])
    assert c.acceptance_estimate()[3] < live[3]  # past the live drafts: the new prior's shape
    one = realistic_profile(max_k=4, acceptance=(0.9, 0.8, 0.7, 0.6))
    one.acceptance_by_temperature = {"0.0": [0.9, 0.8, 0.7, 0.6]}
    c = Controller(goodput_spec(max_k=4), one)
    c.use_temperature(1.0)
    np.testing.assert_allclose(c.acceptance_estimate(), one.acceptance)


def test_unobserved_positions_extrapolated_from_profile_shape():
    p = realistic_profile(max_k=4, acceptance=(0.8, 0.6, 0.4, 0.2))
    c = Controller(goodput_spec(max_k=4, warmup_steps=1), p)
    c.observe(2, [2, 2, 1, 0])  # a_1 = 0.75, a_2 = 0.5 measured (c_2 = 2/3); a_3, a_4 never proposed
    # the profile's conditional rates there (2/3, 1/2), at least the last live one (2/3)
    np.testing.assert_allclose(c.acceptance_estimate(), [0.75, 0.5, 0.5 * 0.4 / 0.6, 0.5 * (2 / 3) ** 2])


def test_forgetting_tracks_step_change_within_bound():
    f, tol = 0.1, 0.05
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, forgetting=f, margin=0.0),
                   realistic_profile(max_k=4), max_batch_size=8)
    for _ in range(60):  # drafts always accepted
        c.observe(4, [4] * 8)
    assert c.acceptance_estimate()[0] == pytest.approx(1.0)
    k_high = c.choose_k(8)
    assert k_high == 4
    # Step change: nothing is accepted any more. The old data's weight after n steps
    # is at most (1 - f)^n, so |estimate - 0| <= tol after n >= log(tol) / log(1 - f).
    bound = math.ceil(math.log(tol / 1.0) / math.log(1.0 - f))
    history = []
    for n in range(1, bound + 1):
        c.observe(4, [0] * 8)
        history.append(c.acceptance_estimate()[0])
    assert history[-1] <= tol
    assert all(h <= (1 - f) ** (i + 1) + 1e-12 for i, h in enumerate(history))
    assert history[bound // 2] > tol  # not instantaneous either
    assert c.choose_k(8) == 0  # the tables were refreshed and the choice followed


def test_tables_refresh_only_when_estimate_moves():
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, forgetting=0.05), realistic_profile(max_k=4))
    c.choose_k(8)
    for _ in range(30):
        c.observe(4, [2] * 8)
    n = c.stats()["table_refreshes"]
    assert n >= 1
    for _ in range(50):  # stationary: the estimate has converged, no more rebuilds
        c.observe(4, [2] * 8)
        c.choose_k(8)
    assert c.stats()["table_refreshes"] - n <= 2


def _drive_to_zero(c, b):
    """A bad stretch: nothing accepted, until the controller holds K = 0."""
    for _ in range(200):
        k = c.choose_k(b)
        if k == 0 and c.current_k == 0:
            return
        c.observe(k, [0] * b)
    raise AssertionError("the controller never dropped to K = 0")


@pytest.mark.parametrize("explore_gap", [0.0, 0.3])
def test_probe_lets_live_acceptance_bring_speculation_back(explore_gap):
    p = realistic_profile(max_k=4)
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, forgetting=0.3, probe_interval=8, explore_gap=explore_gap,
                                latency_forgetting=0.02 if explore_gap else 0.0), p, max_batch_size=8)
    prior_best = int(np.argmax(brute_goodput(p, np.array(p.acceptance), 1, None, 4)))
    assert prior_best > 0
    _drive_to_zero(c, 1)
    ks = [c.choose_k(1) for _ in range(8 * 5)]
    # exactly one step in probe_interval speculates; the hold stays at 0
    probes = [i for i, k in enumerate(ks) if k]
    assert len(probes) == 5 and np.all(np.diff(probes) == 8)
    if not explore_gap:  # only acceptance probes: the profile acceptance's best K
        assert {ks[i] for i in probes} == {prior_best}
    assert c.current_k == 0 and c.stats()["probes"] == 5
    # the probes measure that acceptance is back: speculation resumes
    for _ in range(100):
        k = c.choose_k(1)
        c.observe(k, [k])
        if c.current_k > 0:
            break
    assert c.current_k > 0 and c.acceptance_estimate()[0] > 0.5


def test_without_probes_a_k0_decision_is_final():
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, forgetting=0.3, probe_interval=0),
                   realistic_profile(max_k=4), max_batch_size=8)
    _drive_to_zero(c, 1)
    assert {c.choose_k(1) for _ in range(500)} == {0} and c.stats()["probes"] == 0


def test_no_acceptance_probes_where_the_profile_never_speculates():
    p = realistic_profile(max_k=4)
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, probe_interval=2, explore_gap=0.0), p)
    assert int(np.argmax(brute_goodput(p, np.array(p.acceptance), 64, None, 4))) == 0
    assert {c.choose_k(64) for _ in range(100)} == {0}
    assert {c.choose_k(1000) for _ in range(100)} == {0}  # slow path above max_batch_size
    assert c.stats()["probes"] == 0
    spec = SpecConfig(num_speculative_tokens=4, disable_by_batch_size=1,
                      dynamic=DynamicConfig(warmup_steps=0, probe_interval=2, explore_gap=1.0,
                                            latency_forgetting=0.02))
    c = Controller(spec, p)
    assert {c.choose_k(2) for _ in range(100)} == {0}  # disabled batch sizes are never probed
    assert {c.choose_k(1000) for _ in range(100)} == {0}


def test_no_acceptance_probes_where_the_profile_gain_is_within_the_margin():
    """K=1 beats K=0 by 2% at B=1 and by 20% at B=2 under the profile's acceptance (0.5):
    acceptance probes every ceil(0.4706 / (PROBE_SHARE x 0.02)) = 95 choices at B=1 if the
    margin is under 2%, every ceil(0.25 / (PROBE_SHARE x 0.2)) at B=2 (6 in floating
    point). Within the margin at B=1 only the optimistic probe comes (K=1 wins by 36% were
    every draft accepted), after ceil(0.4706 / OPTIMISTIC_SHARE) = 48 rounds at K=0."""
    p = Profile("cpu", [1, 2], [0, 1], [[10.0, 10.0 * 1.5 / 1.02], [20.0, 20.0 * 1.5 / 1.2]], [0.5])
    for margin, every_b1 in ((0.03, 50), (0.01, 95)):  # 48 K=0 rounds, asked every 2 choices
        c = Controller(goodput_spec(max_k=1, warmup_steps=0, forgetting=0.5, probe_interval=2, margin=margin,
                                    explore_gap=0.0), p, max_batch_size=2)
        for b, every in ((1, every_b1), (2, 6)):
            _drive_to_zero(c, b)
            ks = []
            for _ in range(400):
                ks.append(c.choose_k(b))
                c.observe(ks[-1], [0] * b)
            assert set(np.diff(np.flatnonzero(ks))) == {every}, (margin, b)
        # the makespan path decides on goodput rows computed per call, with the same rule
        ks = []
        for _ in range(400):
            ks.append(c.choose_k(1, request_ids=["r"], remaining=[50]))
            c.observe(ks[-1], [0], request_ids=["r"])
        assert set(np.diff(np.flatnonzero(ks))) == {every_b1}, margin


def test_held_k_is_the_k_choose_k_would_hold_and_asking_changes_nothing():
    """Admission asks `held_k` whether to prefill the draft. Where K=1 wins by less than
    the margin (B=1: 2%) it says K=0, as `choose_k` does, though the bare argmax says K=1;
    past the margin (B=2: 20%) K=1. Asking moves no hold and counts no step; once K=1 is
    held, B=1 keeps it, as `choose_k` would."""
    p = Profile("cpu", [1, 2], [0, 1], [[10.0, 10.0 * 1.5 / 1.02], [20.0, 20.0 * 1.5 / 1.2]], [0.5])
    c = Controller(goodput_spec(max_k=1, warmup_steps=0, probe_interval=0, margin=0.03), p, max_batch_size=2)
    assert np.argmax(c.predicted_goodput(1)) == 1
    assert (c.held_k(1), c.held_k(2)) == (0, 1)
    assert c.current_k == 0 and sum(c.stats()["k_choices"].values()) == 0
    assert (c.choose_k(1), c.choose_k(2), c.held_k(1), c.choose_k(1)) == (0, 1, 1, 1)


def test_admission_asks_held_k_at_the_rows_context_and_per_request():
    """`draft_at_admission` asked `held_k` at the profile's first context and over the
    global rates, where `choose_k` prices the live rows' context and (per_request) their
    own rows: at a 4000-token context K=0 wins, and after a hard request a fresh one
    speculates though the global rates are low; admission now says what `choose_k` does."""
    from dsd_jax.dispatch import DispatchPolicy

    class Row:
        tokens = []

        def __init__(self, request_id, prompt_len):
            self.request_id, self.prompt = request_id, [0] * prompt_len

    lat = [[[10.0, 11.0, 12.0]] * 2, [[40.0, 70.0, 100.0]] * 2]  # verify dominates at 4096
    p = Profile("cpu", [1, 2], [0, 1, 2], lat, [0.8, 0.6], context_lengths=[128, 4096])
    spec = goodput_spec(max_k=2, objective="throughput", probe_interval=0, warmup_steps=0)
    for prompt_len in (100, 4000):
        policy = DispatchPolicy(Controller(spec, p, max_batch_size=2, batch_buckets=[1, 2]), 2, None,
                                budget=lambda r: 100)
        live = [Row("r", prompt_len)]
        drafted = policy.draft_at_admission(1, live, refilled=False)
        assert drafted == (policy.choose_k(live, 1, prompt_len, refilled=False) > 0) == (prompt_len == 100)
    c = Controller(goodput_spec(max_k=2, objective="throughput", per_request=True, probe_interval=0,
                                warmup_steps=0), p, max_batch_size=2, batch_buckets=[1, 2])
    for i in range(6):  # six easy requests, then a long hard one: the global rates fall to ~0.05
        for _ in range(20):
            c.observe(2, [2], 0.012, request_ids=[f"easy{i}"])
        c.forget_request(f"easy{i}")
    for _ in range(60):
        c.observe(2, [0], 0.012, request_ids=["hard"])
    c.forget_request("hard")
    assert c.held_k(1) == 0  # the global row
    assert c.held_k(1, request_ids=["new"]) == c.choose_k(1, request_ids=["new"]) == 2


def test_a_profile_of_k0_alone_holds_k0_without_crashing():
    """A plain-decoding engine's profile (ks [0], no acceptance) given to a goodput
    controller: the optimistic probe took an argmax over no K and crashed at the first
    choice (throughput) or the first probe due (makespan)."""
    p = Profile("cpu", [1, 2, 4], [0], [[10.0], [12.0], [15.0]], [])
    for objective in ("throughput", "makespan"):
        c = Controller(goodput_spec(max_k=4, objective=objective), p, max_batch_size=4, batch_buckets=[1, 2, 4])
        for _ in range(40):
            assert c.choose_k(1, request_ids=["a"], remaining=[100]) == 0
            c.observe(0, [0], 0.01, request_ids=["a"])


def test_the_serving_bucket_is_chosen_over_the_ks_the_engine_runs():
    """Bucket 2 is faster than bucket 1 at K = 0..2, all the engine runs, not at K = 3: a
    lone row ran bucket 1 because of a K it never runs."""
    table = [[7.0, 8.0, 9.0, 9.0], [5.0, 6.0, 7.0, 9.5], [6.0, 7.0, 8.0, 10.0]]
    p = Profile("cpu", [1, 2, 4], [0, 1, 2, 3], table, [0.7, 0.5, 0.3])
    c = Controller(goodput_spec(max_k=2), p, max_batch_size=4, batch_buckets=[1, 2, 4])
    assert c.serving_bucket(1) == 2
    assert Controller(goodput_spec(max_k=3), p, max_batch_size=4, batch_buckets=[1, 2, 4]).serving_bucket(1) == 1


def test_acceptance_probes_are_rarer_where_they_cost_more_for_less():
    """B=1: a K=1 step costs 1.2x a K=0 step and would gain 40% (1.7 tokens / 1.2): probes
    every `probe_interval` choices. B=64: it costs 1.6x for a 6.25% gain (1.7 / 80 against
    1 / 50): probes every ceil(0.6 / (PROBE_SHARE x 0.0625)) = 39 choices, so they spend at
    most a quarter of what they could win (3-6% of dynamic's time at B=16-64 in
    `bench_full_s8` before). Under the makespan objective the gain is the slowest of 64
    rows' at the profile's acceptance: 10000 tokens take 5882 steps at K=1 for the mean row
    plus 2.41 standard deviations of the step count (20.7), a 5.4% gain: every 45."""
    p = Profile("cpu", [1, 64], [0, 1], [[10.0, 12.0], [50.0, 80.0]], [0.7])
    for makespan in (False, True):
        c = Controller(goodput_spec(max_k=1, warmup_steps=0, forgetting=0.5, probe_interval=8, explore_gap=0.0),
                       p, max_batch_size=64)
        for b, every in ((1, 8), (64, 45 if makespan else 39)):
            _drive_to_zero(c, b)
            ids = [f"r{i}" for i in range(b)]
            ks = [c.choose_k(b, request_ids=ids, remaining=[10_000] * b) if makespan else c.choose_k(b)
                  for _ in range(4 * every)]
            probes = [i for i, k in enumerate(ks) if k]
            assert probes and np.all(np.diff(probes) == every), (makespan, b, probes)


def test_probe_per_request_path():
    p = realistic_profile(max_k=4)
    # at B=2 a probe of K=3 costs 0.97 K=0 steps for a 49% gain: due every max(8, 0.97 / (0.25 x 0.49))
    c = Controller(goodput_spec(max_k=4, warmup_steps=0, forgetting=0.5, probe_interval=8, per_request=True),
                   p, max_batch_size=8)
    for _ in range(50):  # requests "a", "b" accept nothing
        k = c.choose_k(2, request_ids=["a", "b"])
        c.observe(k, [0, 0], request_ids=["a", "b"])
    assert c.current_k == 0
    ks = [c.choose_k(2, request_ids=["a", "b"]) for _ in range(16)]
    assert ks.count(0) == 14 and len({k for k in ks if k}) == 1 and c.stats()["probes"] >= 2


# ---------------------------------------------------------------- hysteresis


def _tied_profile(eps):
    """K=2 beats K=1 by eps at B=1; K=1 beats K=2 by eps at B=2. K=0 far behind."""
    al1, al2 = 1.8, 2.3
    itl1 = 12.0
    t2_b1 = al2 / al1 * itl1 / (1 + eps)
    t2_b2 = al2 / al1 * itl1 * (1 + eps)
    return Profile("cpu", [1, 2], [0, 1, 2], [[10.0, itl1, t2_b1], [10.0, itl1, t2_b2]], [0.8, 0.5])


def test_margin_prevents_flapping():
    p = _tied_profile(0.01)
    seq = [1, 2] * 50
    flappy = Controller(goodput_spec(max_k=2, margin=0.0, probe_interval=0), p, max_batch_size=2)
    ks = [flappy.choose_k(b) for b in seq]
    assert ks == [2, 1] * 50
    steady = Controller(goodput_spec(max_k=2, margin=0.03, probe_interval=0), p, max_batch_size=2)
    ks = [steady.choose_k(b) for b in seq]
    assert set(ks) == {2} and steady.stats()["k_choices"] == {0: 0, 1: 0, 2: 100}


def test_starts_at_zero_unless_speculation_clearly_better():
    def prof(gain):  # K=1 goodput = (1 + gain) * K=0 goodput
        return Profile("cpu", [1, 4], [0, 1], [[10.0, 1.5 * 10.0 / (1 + gain)]] * 2, [0.5])

    assert Controller(goodput_spec(max_k=1, margin=0.03), prof(0.01), max_batch_size=4).choose_k(1) == 0
    assert Controller(goodput_spec(max_k=1, margin=0.03), prof(0.10), max_batch_size=4).choose_k(1) == 1
    assert Controller(goodput_spec(max_k=1, margin=0.0), prof(0.01), max_batch_size=4).choose_k(1) == 1


# ---------------------------------------------------------------- per-request


def test_per_request_picks_larger_k_for_high_acceptance():
    p = realistic_profile(max_k=6, acceptance=(0.5,) * 6)
    glob = Controller(goodput_spec(warmup_steps=0, forgetting=0.2, margin=0.0), p)
    per = Controller(goodput_spec(warmup_steps=0, forgetting=0.2, margin=0.0, per_request=True), p)
    good, bad = [f"g{i}" for i in range(16)], [f"b{i}" for i in range(16)]
    for _ in range(40):  # half the requests accept every draft, half none: pooled a_i = 0.5
        for c in (glob, per):
            c.observe(6, [6] * 16 + [0] * 16, request_ids=good + bad)
    np.testing.assert_allclose(glob.acceptance_estimate(), 0.5)
    k_glob = glob.choose_k(16, request_ids=good)
    k_good = per.choose_k(16, request_ids=good)
    assert k_glob == 0 and k_good >= 4
    assert per.choose_k(16, request_ids=bad) == 0
    assert per.choose_k(32, request_ids=good + bad) == glob.choose_k(32) == 0
    # its own counts (5 steps' worth at forgetting 0.2), shrunk toward the global 0.5 as 4 steps
    np.testing.assert_allclose(per.request_acceptance("g0"), (5 + 4 * 0.5) / (5 + 4), atol=1e-3)
    # A new request starts from the global estimate; forget_request frees its row.
    k_new = per.choose_k(1, request_ids=["new"])
    np.testing.assert_allclose(per.request_acceptance("new"), per.acceptance_estimate())
    assert k_new == glob.choose_k(1)
    per.forget_request("new")
    per.forget_request("never-seen")
    assert per.request_acceptance("new") is None
    with pytest.raises(ValueError, match="request_ids"):
        per.choose_k(3, request_ids=["a"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=random_profile(), accs=st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_per_request_is_bruteforce_argmax(prof, accs):
    """goodput(K) = sum_r AL_r(K) / ITL(B, K), checked against a direct computation."""
    kmax = prof.max_k
    c = Controller(goodput_spec(max_k=kmax, margin=0.0, per_request=True), prof)
    ids = [f"r{i}" for i in range(len(accs))]
    c.choose_k(len(ids), request_ids=ids)  # registers rows at the prior
    for rid, a in zip(ids, accs):
        pinned(c._requests, rid, a)  # white-box: its estimate is a_i = a
    b = len(ids)
    k = c.choose_k(b, request_ids=ids)
    al = np.array([sum(1 + kk * a for a in accs) for kk in range(kmax + 1)])
    g = np.array([al[kk] / prof.itl_ms(b, kk) for kk in range(kmax + 1)])
    assert g[k] == pytest.approx(g.max(), rel=1e-12)


# ---------------------------------------------------------------- calibration / stats


def test_calibration_stats():
    p = realistic_profile(max_k=4, acceptance=(0.8, 0.6, 0.4, 0.2))
    c = Controller(goodput_spec(max_k=4, warmup_steps=100), p, max_batch_size=64)
    s = c.stats()
    assert s["itl_mape"] is None and s["al_mape"] is None and s["mode"] == "goodput"
    pred = p.itl_ms(4, 2)
    c.observe(2, [2, 2, 1, 1], step_time_s=pred / 1e3)  # exact ITL; AL meas 2.5 vs pred 2.4
    s = c.stats()
    assert s["itl_mape"] == pytest.approx(0.0, abs=1e-9)
    assert s["al_mape"] == pytest.approx(100 * 0.1 / 2.5)
    c.observe(2, [2, 2, 1, 1], step_time_s=1.1 * pred / 1e3)
    assert c.stats()["itl_mape"] == pytest.approx(100 * (0.1 / 1.1) / 2)
    c.observe(0, [0, 0, 0, 0], step_time_s=p.itl_ms(4, 0) / 1e3)  # K=0: no AL record
    s = c.stats()
    assert s["al_mape"] == pytest.approx(100 * 0.1 / 2.5) and s["steps_observed"] == 3
    assert s["k_steps"] == {0: 1, 1: 0, 2: 2, 3: 0, 4: 0}
    log = c.calibration_log()
    assert len(log) == 3 and log[0]["pred_al"] == pytest.approx(2.4) and log[0]["meas_al"] == 2.5
    assert set(s) >= {"mode", "steps_observed", "acceptance", "itl_mape", "al_mape", "k_choices"}
    assert s["acceptance"] == pytest.approx([0.8, 0.6, 0.4, 0.2])


def test_static_mode_tracks_acceptance_without_profile():
    c = Controller(SpecConfig(num_speculative_tokens=3), max_batch_size=4)
    assert np.isnan(c.acceptance_estimate()).all()
    assert c.stats()["acceptance"] == [None, None, None]
    c.observe(2, [2, 0], step_time_s=0.01)
    est = c.acceptance_estimate()
    assert est[:2].tolist() == [0.5, 0.5] and np.isnan(est[2])
    assert c.stats()["itl_mape"] is None and c.stats()["al_mape"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.stats()



def test_settled_only_where_no_probe_or_learning_can_change_the_choice():
    """Static and schedule modes are settled on whatever they choose. Goodput is settled
    only holding K=0 at a batch size with no acceptance probe (B=64: even the profile's
    acceptance leaves K=1 within the margin) and nothing else to learn; at B=1 a probe
    is due every `probe_interval` choices, and a held K>0 always adapts. Only under the
    throughput objective: other rows move at K=0 too. Latency learning alone keeps a hold
    settled (K=0's factor moves slowly, and the hold is asked again every dispatch);
    exploring a close contender does not."""
    static = Controller(SpecConfig(method="draft_model", num_speculative_tokens=2), None, max_batch_size=64)
    assert static.settled(1, 2) and static.settled(64, 2)
    # (at B=64 K=1 loses even were every draft accepted: no optimistic probe either)
    p = Profile("cpu", [1, 64], [0, 1], [[10.0, 12.0], [50.0, 101.0]], [0.52])
    kw = dict(max_k=1, warmup_steps=0, forgetting=0.5, probe_interval=8, explore_gap=0.0)
    c = Controller(goodput_spec(objective="throughput", **kw), p, max_batch_size=64)
    _drive_to_zero(c, 64)
    assert c.current_k == 0 and c.settled(64, 0) and not c.settled(64, 1)
    # rows of their own (makespan: budgets that shrink; per request), or a contender to explore
    for other in (dict(objective="makespan"), dict(objective="throughput", per_request=True),
                  dict(objective="throughput", latency_forgetting=0.02, explore_gap=0.3)):
        o = Controller(goodput_spec(**{**kw, **other}), p, max_batch_size=64)
        _drive_to_zero(o, 64)
        assert o.current_k == 0 and not o.settled(64, 0), other
    learning = Controller(goodput_spec(objective="throughput", **{**kw, "latency_forgetting": 0.05}), p,
                          max_batch_size=64)
    _drive_to_zero(learning, 64)
    assert learning.current_k == 0 and learning.settled(64, 0)
    assert not c.settled(1, 0)  # B=1: K=1 would gain 27% at the profile's acceptance: probes
    assert not any(c.choose_k(64) for _ in range(100))  # settled indeed: no probe at B=64
    # without probes: not settled on K=0 where the goodput row beats the hold, settled once
    # live acceptance keeps it there
    no_probes = Controller(goodput_spec(max_k=1, warmup_steps=0, forgetting=0.5, probe_interval=0,
                                        objective="throughput"), p, max_batch_size=64)
    assert not no_probes.settled(1, 0) and no_probes.choose_k(1) == 1 and not no_probes.settled(1, 1)
    _drive_to_zero(no_probes, 1)
    assert no_probes.settled(1, 0) and not any(no_probes.choose_k(1) for _ in range(50))


def test_static_controller_with_a_profile_of_fewer_ks_predicts_over_the_profiles_ks():
    """predicted_goodput / held_k on a static controller whose K exceeds the profile's
    (it raised a broadcasting error: AL over 0..4 against ITL over the profile's 0..2)."""
    p = realistic_profile(max_k=2, acceptance=(0.8, 0.6))
    c = Controller(SpecConfig(num_speculative_tokens=4), p, max_batch_size=8)
    g = c.predicted_goodput(2)
    assert g.shape == (3,) and np.all(np.isfinite(g))
    assert c.held_k(2) == int(np.argmax(g))
    assert c.choose_k(2) == 4  # the static K itself is untouched
