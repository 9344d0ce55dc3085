"""Sampled speculative decoding is distributed exactly as the target's sampling
distribution; drafter-invariant mode reproduces plain sampling token for token."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsd_jax import SamplingParams, kernels, models, sampling
from conftest import FixedK, make_engine, oracle_logits, scaled, tiny_config

VOCAB = 8
PROMPT = [1, 5, 2]
N_SAMPLES = 2000
# jitted once: called eagerly, the sampling code's `lax.cond`s compile again on every call
sampling_probs = jax.jit(sampling.sampling_probs)
filter_logits = jax.jit(sampling.filter_logits)


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = scaled(models.init_model(tiny_config(vocab_size=VOCAB), seed=3), 6.0)
    draft = scaled(models.init_model(tiny_config(vocab_size=VOCAB, num_layers=1), seed=4), 6.0)
    return target, draft


def exact_joint(model, sp: SamplingParams, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2 | prompt) under the target's processed distribution, by enumeration."""
    def probs(seq):
        logits = jnp.asarray(oracle_logits(model, seq))[None]
        return np.asarray(sampling_probs(logits, jnp.array([sp.temperature]), jnp.array([sp.top_k]),
                                         jnp.array([sp.top_p]), min_p=jnp.array([sp.min_p])))[0]
    p1 = probs(prompt)
    return np.stack([p1[a] * probs(list(prompt) + [a]) for a in range(VOCAB)])


def tv_threshold(joint: np.ndarray, n: int, quantile=0.999, reps=2000) -> float:
    """The `quantile` of total-variation distance between n multinomial draws from
    `joint` and `joint` itself: an exact-sampler passes with probability `quantile`."""
    rng = np.random.default_rng(0)
    flat = joint.ravel().astype(np.float64)
    flat /= flat.sum()
    draws = rng.multinomial(n, flat, size=reps) / n
    return float(np.quantile(0.5 * np.abs(draws - flat).sum(1), quantile))


def empirical_joint(outs) -> np.ndarray:
    counts = np.zeros((VOCAB, VOCAB))
    for o in outs:
        counts[o.token_ids[0], o.token_ids[1]] += 1
    return counts / counts.sum()


SAMPLING = {
    "temperature": SamplingParams(temperature=1.0, max_tokens=2),
    "top_k": SamplingParams(temperature=0.8, top_k=3, max_tokens=2),
    "top_p": SamplingParams(temperature=1.0, top_p=0.7, max_tokens=2),
    "min_p": SamplingParams(temperature=1.0, min_p=0.4, max_tokens=2),
}


@pytest.mark.runtime_bound
@pytest.mark.parametrize("draft_sampling", ["sample", "argmax"])
def test_sampled_output_matches_target_distribution(small_vocab_pair, draft_sampling):
    target, draft = small_vocab_pair
    engine = make_engine(target, draft, method="draft_model", draft_sampling=draft_sampling,
                         max_batch_size=64, batch_buckets=(64,))
    # a one-hot q (argmax drafts) is checked at K = 4 only: its K = 1 rounds hold nothing K = 4 lacks
    ks = (1, 4) if draft_sampling == "sample" else (4,)
    for (name, sp), k in itertools.product(SAMPLING.items(), ks):
        engine.controller = FixedK([k])
        params = [SamplingParams(**{**sp.__dict__, "seed": 1000 * k + i}) for i in range(N_SAMPLES)]
        outs = engine.generate([PROMPT] * N_SAMPLES, params)
        exact = exact_joint(target, sp)
        tv = 0.5 * np.abs(empirical_joint(outs) - exact).sum()
        threshold = tv_threshold(exact, N_SAMPLES)
        assert tv < threshold, (name, k, draft_sampling, tv, threshold)
        # the test has power: the draft's own distribution is far outside the threshold
        assert 0.5 * np.abs(exact_joint(draft, sp) - exact).sum() > 2 * threshold
        if name == "min_p":  # and so is the target's law without min_p
            unfiltered = exact_joint(target, SamplingParams(temperature=sp.temperature, max_tokens=2))
            assert 0.5 * np.abs(unfiltered - exact).sum() > 2 * threshold


def test_rejection_kernel_first_token_is_exactly_p():
    """One accept/reject round over many noise draws: the emitted token ~ p_1 exactly."""
    n, V = 100_000, 6
    key = jax.random.key(0)
    kp, kq, kd, ku, kn = jax.random.split(key, 5)
    p = jax.nn.softmax(2 * jax.random.normal(kp, (V,)))
    q = jax.nn.softmax(2 * jax.random.normal(kq, (V,)))
    drafts = jax.random.categorical(kd, jnp.log(q), shape=(n, 1)).astype(jnp.int32)
    target = jnp.broadcast_to(p, (n, 2, V))
    draft = jnp.broadcast_to(q, (n, 1, V))
    uniforms = jax.random.uniform(ku, (n, 1))
    noise = jax.random.gumbel(kn, (n, 2, V))
    _, tokens = kernels.rejection_sample_xla(target, draft, drafts, uniforms, noise)
    freq = np.bincount(np.asarray(tokens[:, 0]), minlength=V) / n
    assert np.abs(freq - np.asarray(p)).max() < 4 * np.sqrt(0.25 / n)


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_drafter_invariant_equals_plain_sampling(small_vocab_pair, method):
    target, draft = small_vocab_pair
    prompts = [[1, 5, 2], [3], [2, 2, 7, 1, 2, 2, 7, 1, 2]]
    params = [SamplingParams(temperature=1.0, max_tokens=20, seed=11),
              SamplingParams(temperature=0.7, top_k=4, max_tokens=20, seed=12),
              SamplingParams(temperature=1.0, top_p=0.8, min_p=0.1, max_tokens=20, seed=13)]
    plain = make_engine(target, None, method="none", num_speculative_tokens=0)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    schedules = [[1], [4], [0, 3, 0, 0, 4, 1, 2, 0]]
    rng = np.random.default_rng(0)
    schedules.append(list(rng.integers(0, 5, size=30)))
    engine = make_engine(target, draft if method == "draft_model" else None, method=method,
                         acceptance="drafter_invariant")
    for schedule in schedules:
        engine.controller = FixedK(schedule)
        assert [o.token_ids for o in engine.generate(prompts, params)] == expected, schedule


@pytest.mark.parametrize("draft_vocab", [6, 11])
def test_a_draft_with_a_differently_padded_vocabulary_stays_exact(small_vocab_pair, draft_vocab):
    """One tokenizer padded to two sizes (Qwen2.5-0.5B 151936 rows, Qwen2.5-7B 152064) was
    refused. The draft's q now lives in the target's vocabulary (rows it lacks at 0, ids past
    the target's cut): greedy is plain greedy, drafter-invariant is plain sampling token for
    token, and rejection sampling is distributed as the target (K = 4, 2000 samples)."""
    target, _ = small_vocab_pair
    draft = scaled(models.init_model(tiny_config(vocab_size=draft_vocab, num_layers=1), seed=4), 6.0)
    prompts = [[1, 5, 2], [3], [2, 7, 7, 1, 2, 7, 7, 1]]  # 7: an id a 6-row draft has no embedding for
    params = [SamplingParams(temperature=t, max_tokens=16, seed=20 + i) for i, t in enumerate((0.0, 1.0, 0.7))]
    plain = make_engine(target, None, method="none", num_speculative_tokens=0)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    invariant = make_engine(target, draft, method="draft_model", acceptance="drafter_invariant")
    for schedule in ([4], [0, 4]):  # [0, 4]: the draft catches up after rounds without it
        invariant.controller = FixedK(schedule)
        assert [o.token_ids for o in invariant.generate(prompts, params)] == expected, schedule

    engine = make_engine(target, draft, method="draft_model", max_batch_size=64, batch_buckets=(64,))
    sp = SAMPLING["temperature"]
    outs = engine.generate([PROMPT] * N_SAMPLES, [SamplingParams(temperature=1.0, max_tokens=2, seed=i)
                                                 for i in range(N_SAMPLES)])
    exact = exact_joint(target, sp)
    threshold = tv_threshold(exact, N_SAMPLES)
    assert 0.5 * np.abs(empirical_joint(outs) - exact).sum() < threshold
    assert engine.metrics()["acceptance_per_position"][0] > 0.3  # drafts were accepted, not all rejected


def test_group_of_eight_prefills_once_and_each_completion_is_plain_sampling(small_vocab_pair):
    """GRPO's case: SamplingParams(n=8) on one prompt is one prefill program call, and in
    drafter-invariant mode completion g equals plain sampling of that prompt with seed + g,
    whatever K did."""
    target, draft = small_vocab_pair
    prompt = [1, 5, 2, 2, 7, 1, 2]
    plain = make_engine(target, None, method="none", num_speculative_tokens=0, max_batch_size=8,
                        batch_buckets=(8,))
    expected = [o.token_ids for o in plain.generate(
        [prompt] * 8, [SamplingParams(temperature=1.0, max_tokens=16, seed=40 + g) for g in range(8)])]
    engine = make_engine(target, draft, method="draft_model", acceptance="drafter_invariant",
                         num_speculative_tokens=2, max_batch_size=8, batch_buckets=(8,))
    engine.controller = FixedK([2, 0, 1, 2])
    calls = []
    compiled = engine.programs.prefill

    def counting(n, c):
        exe = compiled(n, c)

        def run(*args):
            calls.append(int(np.asarray(args[6]).sum()))  # real prompt tokens in this call
            return exe(*args)
        return run

    engine.programs.prefill = counting
    try:
        outs = engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=16, seed=40, n=8))
    finally:
        engine.programs.prefill = compiled
    assert calls == [len(prompt)]
    assert [o.index for o in outs] == list(range(8))
    assert [o.token_ids for o in outs] == expected
    assert len({tuple(t) for t in expected}) > 4  # the seeds really differ


def test_drafter_invariant_acceptance_vs_rejection(small_vocab_pair):
    """Reports both modes' acceptance (the coupling accepts less: it needs exact
    agreement of two Gumbel-argmaxes rather than min(1, p/q))."""
    target, draft = small_vocab_pair
    rates = {}
    params = [SamplingParams(temperature=1.0, max_tokens=16, seed=i) for i in range(64)]
    for mode in ("rejection", "drafter_invariant"):
        ctl = FixedK([4])
        engine = make_engine(target, draft, controller=ctl, method="draft_model", acceptance=mode,
                             max_batch_size=64, batch_buckets=(64,))
        engine.generate([PROMPT] * 64, params)
        rates[mode] = engine.metrics()["acceptance_per_position"][0]
    print("first-position acceptance:", rates)
    assert 0 < rates["drafter_invariant"] <= rates["rejection"] + 0.1


def test_sampling_params_take_integers_and_refuse_floats_strings_and_bools():
    """n=2.0, seed=2.5 or a stop id 1.9 passed and were truncated (or failed deep in the
    engine); a bare int as stop_token_ids raised a raw TypeError. Python and numpy
    integers are taken and stored as ints; a seed must fit the device's uint32."""
    sp = SamplingParams(n=np.int64(2), top_k=np.int32(3), max_tokens=np.uint8(5), seed=np.int64(7),
                        temperature=np.float32(0.5), stop_token_ids=np.array([3, 4]))
    assert (sp.n, sp.top_k, sp.max_tokens, sp.seed, sp.stop_token_ids) == (2, 3, 5, 7, (3, 4))
    assert all(type(v) is int for v in (sp.n, sp.top_k, sp.max_tokens, sp.seed, *sp.stop_token_ids))
    assert SamplingParams(stop_token_ids=5).stop_token_ids == (5,)  # one stop id
    assert SamplingParams(seed=2 ** 32 - 1).seed == 2 ** 32 - 1
    for kwargs, match in [
            (dict(n=2.0), r"n \(completions per prompt\) must be an integer, got 2.0"),
            (dict(top_k=True), "top_k"), (dict(max_tokens=4.5), "max_tokens"),
            (dict(seed=2.5), "seed must be an integer, got 2.5"), (dict(seed=-2), "seed"),
            (dict(seed=2 ** 32), "seed"), (dict(stop_token_ids=[1.9]), r"stop_token_ids\[0\].*1.9"),
            (dict(stop_token_ids=[3, True]), r"stop_token_ids\[1\]"),
            (dict(stop_token_ids="5"), "stop_token_ids"), (dict(temperature="0.5"), "temperature"),
            (dict(include_stop_token="False"), "include_stop_token")]:
        with pytest.raises(ValueError, match=match):
            SamplingParams(**kwargs)


def test_sampling_params_read_vllms_conventions():
    """vLLM's seed -1 (no seed), max_tokens None (what the context holds) and greedy's
    filters reset to off (a greedy row's logprobs were renormalised over its top_k) were
    refused or kept."""
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=np.int64(-1)).seed is None
    assert SamplingParams(max_tokens=None, min_tokens=5).max_tokens is None
    greedy = SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.1)
    assert (greedy.top_k, greedy.top_p, greedy.min_p) == (0, 1.0, 0.0)
    with pytest.raises(ValueError, match="top_p must be in"):  # still checked
        SamplingParams(temperature=0.0, top_p=2.0)


def test_repeated_stop_ids_count_once():
    """stop_token_ids=[1] * 9 holds one id but was refused by the engine's limit of 8:
    repeats are dropped, the first occurrences' order kept."""
    from dsd_jax.state import MAX_STOP_IDS
    assert SamplingParams(stop_token_ids=[1] * (MAX_STOP_IDS + 1)).stop_token_ids == (1,)
    assert SamplingParams(stop_token_ids=np.array([5, 3, 5, 0, 3])).stop_token_ids == (5, 3, 0)
    with pytest.raises(ValueError, match=r"stop_token_ids\[2\]"):  # a repeat is still checked
        SamplingParams(stop_token_ids=[3, 3, 3.0])


def _reference_filter(logits: np.ndarray, top_k: int, top_p: float, min_p: float = 0.0) -> np.ndarray:
    """Min-p (probability at least min_p times the largest), top-k over what it kept (ties at
    the k-th value kept), then top-p over what top-k kept: the kept set of one row, in numpy
    float64."""
    full = np.exp(logits - logits.max())
    logits = np.where(full / full.sum() >= min_p * full.max() / full.sum(), logits, -np.inf)
    finite = np.isfinite(logits)
    order = np.argsort(-logits, kind="stable")
    kth = logits[order[min(top_k, finite.sum()) - 1]] if top_k > 0 else -np.inf
    kept = finite & (logits >= kth)
    z = np.where(kept, logits, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    sorted_p = p[order]
    before = np.cumsum(sorted_p) - sorted_p
    n_keep = max(int(np.sum((before < top_p) & kept[order])), 1)
    return finite & (logits >= logits[order[n_keep - 1]])


def test_top_p_applies_to_every_token_top_k_kept():
    """Tied logits at the k-th value survive top-k; top-p must normalise over them too (it
    used the first k sorted entries only, inflating each probability, and kept too few).
    bfloat16 logits tie often."""
    cases = [([3, 2, 1, 1], 3, 0.63), ([3, 2, 1, 1, 1, 1], 3, 0.55), ([5, 5, 5, 1], 1, 0.5)]
    rng = np.random.default_rng(0)
    for _ in range(40):
        row = np.asarray(jnp.asarray(rng.normal(0, 2, 64), jnp.bfloat16).astype(jnp.float32))
        cases.append((row, int(rng.integers(1, 12)), float(rng.uniform(0.2, 0.95))))
    for logits, k, p in cases:
        logits = np.asarray(logits, np.float32)
        got = np.asarray(filter_logits(jnp.asarray(logits)[None], jnp.array([k]),
                                       jnp.array([p], jnp.float32)))[0] > -np.inf
        np.testing.assert_array_equal(got, _reference_filter(logits.astype(np.float64), k, p),
                                      err_msg=f"logits {logits}, top_k {k}, top_p {p}")


def test_min_p_keeps_what_is_at_least_min_p_as_likely_as_the_likeliest():
    """vLLM's min_p, before top-k and top-p (which then count only what it kept)."""
    cases = [([3, 2, 1, 1], 0, 1.0, 0.3), ([3, 2, 1, 1], 3, 1.0, 0.3), ([3, 2.5, 2, 1], 0, 0.6, 0.2),
             ([2, 2, 0, 0], 0, 1.0, 1.0), ([4, 1, 1, 1], 2, 0.9, 0.0)]
    rng = np.random.default_rng(1)
    for _ in range(40):
        row = rng.normal(0, 2, 64)
        cases.append((row, int(rng.integers(0, 12)), float(rng.uniform(0.2, 1.0)),
                      float(rng.uniform(0.0, 0.5))))
    for logits, k, p, m in cases:
        logits = np.asarray(logits, np.float32)
        got = np.asarray(filter_logits(jnp.asarray(logits)[None], jnp.array([k]),
                                       jnp.array([p], jnp.float32), jnp.array([m], jnp.float32)))[0] > -np.inf
        np.testing.assert_array_equal(got, _reference_filter(logits.astype(np.float64), k, p, m),
                                      err_msg=f"logits {logits}, top_k {k}, top_p {p}, min_p {m}")
    assert SamplingParams(min_p=np.float32(0.5)).min_p == 0.5
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"min_p must be in \[0, 1\]"):
            SamplingParams(min_p=bad)


def test_temperature_edges_and_vllm_top_k_off():
    """inf/NaN temperatures are refused; one below GREEDY_BELOW is greedy (logits / T
    overflowed to inf and gave NaN probabilities); top_k -1 is vLLM's "off"."""
    for t in (float("inf"), float("nan"), -0.5):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            SamplingParams(temperature=t)
    assert SamplingParams(temperature=2e-38).temperature == 0.0
    assert SamplingParams(temperature=sampling.GREEDY_BELOW).temperature == sampling.GREEDY_BELOW
    assert SamplingParams(top_k=-1).top_k == 0
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)


def _chi2_p_value(observed, law) -> float:
    """Chi-square p-value of counts `observed` against the exact probabilities `law` (same
    shape; cells with an expected count under 5 pooled)."""
    from scipy import stats
    obs, exp = np.ravel(observed).astype(float), np.ravel(law) * np.sum(observed)
    small = exp < 5
    obs = np.append(obs[~small], obs[small].sum())
    exp = np.append(exp[~small], exp[small].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


@pytest.mark.runtime_bound
def test_a_fixed_seed_rl_loop_drafting_from_its_own_rollouts_stays_exact(small_vocab_pair, monkeypatch):
    """An RL loop seeding each prompt the same every epoch, its last rollout as the suffix
    reference: a reference drawn with the request's seed came from the noise that would judge
    a draft copied from it. Under rejection acceptance the engine mixes each reference's
    tokens and noise seed into the request's seed, so every epoch is an exact sample of the
    target (the law of the first two tokens, chi-square), whether the references come back
    as outputs, through a RolloutMemory or as bare tokens (fresh per call)."""
    import dsd_jax.engine as engine_module
    from dsd_jax.rollout_memory import RolloutMemory
    target, _ = small_vocab_pair
    engine = make_engine(target, None, method="suffix", max_batch_size=64, batch_buckets=(64,),
                         controller=FixedK([3]), num_speculative_tokens=3)
    prompt, n = [3, 0], 4096
    sp = SamplingParams(temperature=1.0, top_k=3, max_tokens=2)
    params = [SamplingParams(**{**sp.__dict__, "seed": i}) for i in range(n)]
    law = exact_joint(target, sp, prompt).astype(np.float64)

    def p_value(outs):
        counts = np.zeros((VOCAB, VOCAB))
        for o in outs:
            counts[o.token_ids[0], o.token_ids[1]] += 1
        return _chi2_p_value(counts, law)

    def epochs(run, count=5):
        outs = [run(None)]
        for _ in range(count - 1):
            outs.append(run(outs[-1]))
        return outs

    as_outputs = epochs(lambda prev: engine.generate(
        [prompt] * n, params, references=None if prev is None else [[o] for o in prev]))
    bare = epochs(lambda prev: engine.generate(  # (the call number is mixed in: fewer epochs do)
        [prompt] * n, params, references=None if prev is None else [[o.token_ids] for o in prev]), 3)
    for outs in (as_outputs, bare):
        assert min(map(p_value, outs)) > 1e-4, [p_value(o) for o in outs]
    # a RolloutMemory keeps each completion's noise seed, and each epoch draws from a new one
    memory, seen = RolloutMemory(per_prompt=1), set()
    for _ in range(4):  # (the first has no reference: its noise seed is the request's)
        (out,) = engine.generate([prompt], params[:1], memory=memory)
        assert memory.entries(prompt) == [(out.token_ids, out.noise_seed)] and out.noise_seed not in seen
        seen.add(out.noise_seed)
    # same seed and same references: the same output
    again = engine.generate([prompt] * 64, params[:64], references=[[o] for o in as_outputs[3][:64]])
    assert [o.token_ids for o in again] == [o.token_ids for o in as_outputs[4][:64]]
    # power: mixing the tokens alone (the noise seeds left out) repeats an epoch's noise
    # whenever its output equals its reference, and the law drifts within five epochs
    mix = engine_module.references_seed
    monkeypatch.setattr(engine_module, "references_seed",
                        lambda seed, refs, call: mix(seed, [(ids, 0) for ids, _ in refs], 0))
    drifting = epochs(lambda prev: engine.generate(
        [prompt] * n, params, references=None if prev is None else [[o] for o in prev]))
    assert p_value(drifting[-1]) < 1e-6
