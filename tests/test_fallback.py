"""Under backend="auto" on a GPU/TPU, a Pallas kernel that fails to compile at warmup
falls back to its XLA path with a warning naming the kernel, the device and the error;
backend="pallas" fails loudly. Forced on CPU: the platform claims "gpu" with "auto"
picking Pallas for both kernels, the attention kernel raises while lowering, and the
rejection kernel runs in interpret mode (so it compiles here and stays Pallas)."""

from __future__ import annotations

import warnings

import jax
import pytest

import dsd_jax as dsd
from dsd_jax import kernels
from dsd_jax.kernels import attention_pallas, rejection_pallas

PROMPTS = [[3, 9, 4, 1, 7], [5, 2]]


def _engine(tiny_pair, backend):
    target, draft = tiny_pair
    return dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2),
                          max_batch_size=2, max_seq_len=32, prefill_chunk=16, backend=backend,
                          batch_buckets=(2,))


def _tokens(engine):
    outs = engine.generate(PROMPTS, dsd.SamplingParams(temperature=0.0, max_tokens=8))
    return [o.token_ids for o in outs]


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU whose Pallas attention fails to lower; Pallas rejection sampling interpreted."""
    def broken(*args, **kw):
        raise NotImplementedError("Mosaic GPU lowering failed: forced for the test\nsecond line")

    real = rejection_pallas.rejection_sample

    def interpreted(*args, **kw):
        return real(*args, **{**kw, "interpret": True, "platform": "gpu"})

    monkeypatch.setattr(kernels, "default_platform", lambda device=None: "gpu")
    monkeypatch.setitem(kernels.AUTO, "gpu", kernels.KernelBackends("pallas", "pallas"))
    monkeypatch.setattr(attention_pallas, "verify_attention", broken)
    monkeypatch.setattr(rejection_pallas, "rejection_sample", interpreted)


def test_auto_falls_back_per_kernel(tiny_pair, fake_gpu):
    engine = _engine(tiny_pair, "auto")
    assert engine.kernel_backends == {"attention": "pallas", "rejection": "pallas"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = engine.warmup()
    fell = [w for w in caught if issubclass(w.category, kernels.PallasFallbackWarning)]
    assert len(fell) == 1, [str(w.message) for w in caught]
    msg = str(fell[0].message)
    assert "'attention'" in msg and jax.devices()[0].device_kind in msg
    assert "NotImplementedError: Mosaic GPU lowering failed: forced for the test" in msg
    assert "second line" not in msg
    assert engine.kernel_backends == {"attention": "xla", "rejection": "pallas"}
    assert n == len(engine.programs._compiled)       # everything compiled, after the switch
    got = _tokens(engine)
    ref = _tokens(_engine(tiny_pair, "xla"))
    assert got == ref


def test_explicit_pallas_fails_loudly(tiny_pair, fake_gpu):
    engine = _engine(tiny_pair, "pallas")
    with pytest.raises(NotImplementedError, match="forced for the test"):
        engine.warmup()


def test_unrelated_error_is_not_masked(tiny_pair, fake_gpu, monkeypatch):
    """A failure no kernel switch fixes is raised as it is, with no warning."""
    from dsd_jax import step as step_lib
    real = step_lib.admit

    def admit(*args, **kw):
        raise RuntimeError("not a kernel problem")

    engine = _engine(tiny_pair, "auto")
    monkeypatch.setattr(step_lib, "admit", admit)
    engine.programs._build(engine.programs.opts, engine.programs.drafter)  # picks up the patch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="not a kernel problem"):
            engine.programs.admit(2)
    assert not [w for w in caught if issubclass(w.category, kernels.PallasFallbackWarning)]
    assert engine.kernel_backends == {"attention": "pallas", "rejection": "pallas"}
    monkeypatch.setattr(step_lib, "admit", real)


@pytest.mark.parametrize("platform, expected", [
    ("gpu", {"attention": "pallas", "rejection": "xla"}),   # measured on an H200
    ("tpu", {"attention": "pallas", "rejection": "pallas"}),
    ("cpu", {"attention": "xla", "rejection": "xla"})])
def test_auto_picks_per_kernel_and_platform(platform, expected, monkeypatch):
    monkeypatch.setattr(kernels, "default_platform", lambda device=None: platform)
    assert kernels.resolve_backends("auto")._asdict() == expected
    with pytest.raises(ValueError, match="kernel must be one of"):
        kernels.resolve_backend("auto")
    # a KernelBackends' entries as the strings: "auto" is the platform's, a typo an error
    mixed = kernels.KernelBackends("auto", "xla")
    assert kernels.resolve_backends(mixed) == (expected["attention"], "xla")
    with pytest.raises(ValueError, match=r"KernelBackends.rejection must be one of .*'interpet'"):
        kernels.resolve_backend(kernels.KernelBackends("xla", "interpet"), "rejection")


def test_cpu_auto_is_xla_and_never_probes(tiny_pair):
    engine = _engine(tiny_pair, "auto")
    assert engine.kernel_backends == {"attention": "xla", "rejection": "xla"}
    assert engine.programs._fallback is False


def test_both_kernels_fall_back_when_each_alone_is_not_enough(tiny_pair, fake_gpu, monkeypatch):
    """Each switch alone still fails (the other kernel is broken too): both go to XLA."""
    def broken(*args, **kw):
        raise ValueError("Triton compilation failed")

    monkeypatch.setattr(rejection_pallas, "rejection_sample", broken)
    engine = _engine(tiny_pair, "auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.programs.step(1, 2)
    msgs = [str(w.message) for w in caught if issubclass(w.category, kernels.PallasFallbackWarning)]
    assert len(msgs) == 2 and "'attention'" in msgs[0] and "'rejection'" in msgs[1]
    assert engine.kernel_backends == {"attention": "xla", "rejection": "xla"}
    assert list(engine.programs._compiled) == [("step", 1, 2)]


def test_auto_resolves_for_the_engines_device(tiny_pair, monkeypatch):
    """"auto" follows the device the engine runs on, not the default backend: a GPU as the
    default backend with the engine on a CPU (`jax.default_device`) runs XLA, no fallback."""
    import jax
    from conftest import make_engine
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert kernels.resolve_backends("auto")._asdict() == {"attention": "pallas", "rejection": "xla"}
    eng = make_engine(*tiny_pair, max_batch_size=2, batch_buckets=(2,), num_speculative_tokens=1)
    assert eng.kernel_backends == {"attention": "xla", "rejection": "xla"}
    assert eng.programs._fallback is False


def test_a_profile_timed_with_the_fallen_back_kernel_is_flagged(tiny_pair, fake_gpu):
    """The profile's kernels are checked at construction, before any fallback: once Pallas
    attention falls back to XLA, a profile timed with it is another kernel's, and says so."""
    from dsd_jax.profile import Profile, ProfileMismatchWarning
    bs, ks, ctx = [1, 2], [0, 1, 2], [16, 32]
    timed = {"attention": "pallas", "rejection": "pallas"}
    profile = Profile(device_kind=jax.devices()[0].device_kind, batch_sizes=bs, ks=ks, context_lengths=ctx,
                      latency_ms=[[[1.0 + k for k in ks] for _ in bs] for _ in ctx], acceptance=[0.8, 0.6],
                      platform="cpu", jax_version=jax.__version__, method="draft_model",
                      meta={"engine": {"kernel_backends": timed}})
    target, draft = tiny_pair
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=2,
                                max_seq_len=32, prefill_chunk=16, backend="auto", batch_buckets=(2,),
                                profile=profile)
        assert not [w for w in caught if "timed with kernels" in str(w.message)]  # it matched then
        engine.programs.step(1, 2)  # the first program: attention falls back here
    flagged = [w for w in caught if issubclass(w.category, ProfileMismatchWarning)
               and "timed with kernels" in str(w.message)]
    assert engine.kernel_backends == {"attention": "xla", "rejection": "pallas"}
    assert len(flagged) == 1 and "'attention': 'xla'" in str(flagged[0].message)
