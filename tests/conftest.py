"""Shared fixtures: tiny random model pairs and an independent plain-decoding oracle."""

from __future__ import annotations

import functools
import os

from xla_flags import use_fast_compile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
use_fast_compile()  # compile-bound, nothing timed (`xla_flags.py`)

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dsd_jax import models


def tiny_config(**kw) -> models.ModelConfig:
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=8, rope_theta=10000.0)
    base.update(kw)
    return models.ModelConfig(**base)


def scaled(model, factor: float):
    """Sharper logits make random models' greedy paths less degenerate."""
    graph, params = nnx.split(model)
    params = jax.tree.map(lambda x: x * factor if x.ndim == 2 else x, params)
    return nnx.merge(graph, params)


SUBPROCESS_MODULES = ("test_multihost.py", "test_notebook.py", "test_mesh.py")  # `background.py`
# The longest modules, longest first (seconds of tests in a run on 2 cores, 2026-12-02: 486, 390,
# 215, 134, 126, 92, 75, 73, 60, 56, 51); the rest take under 30 s each.
LONGEST_FIRST = ("test_engine.py", "test_spec_sampling.py", "test_prefix_sharing.py", "test_eagle3.py",
                 "test_tunix.py", "test_device_check.py", "test_engine_fuzz.py", "test_cli.py",
                 "test_top_logprobs.py", "test_kernels.py", "test_spec_greedy.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml): a worker per core, at most 4 (each holds a JAX runtime
    and compiles on one core)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # not on macOS
    return min(cores or 1, 4)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the run's first process: its workers inherit it
        import background
        background.create_run_dir()


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        import background
        background.remove_run_dir()


def pytest_collection_modifyitems(items):
    """The longest modules first, the subprocess suites' last and the mesh's at the very end
    (their jobs run beside the rest, and the mesh job's tests only read its results). xdist
    hands whole files out in this order (`--no-loadscope-reorder`
    in pyproject.toml; by default it sorts them by their number of tests), so no long file
    comes last to one worker while the others idle."""
    def rank(item):
        name = os.path.basename(str(item.path))
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        return (2, SUBPROCESS_MODULES.index(name)) if name in SUBPROCESS_MODULES else (1, 0)
    items.sort(key=rank)  # stable: the same order in every xdist worker


def pytest_collection_finish(session):
    """The subprocess jobs start now and run alongside the rest, the mesh job once the other
    two end, with the test processes lowered beneath it (`background.py`)."""
    import background
    if not session.config.option.collectonly:
        background.start({os.path.basename(str(item.path)) for item in session.items})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import background
    with background.busy():  # lowered beneath the mesh job while it runs
        return (yield)


def pytest_sessionfinish(session, exitstatus):
    import background
    stopped = exitstatus == pytest.ExitCode.INTERRUPTED or session.shouldstop or session.shouldfail
    background.stop_all(wait=not stopped)  # a stopped run needs no job's results


def pytest_terminal_summary(terminalreporter, config):
    """When the subprocess jobs ran and for how long, where the run's log keeps it (their
    folder goes with the run): a job run twice, or late, explains a slow run."""
    import background
    if hasattr(config, "workerinput"):
        return
    lines = background.summary()
    if lines:
        terminalreporter.section("subprocess jobs")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def compilation_cache():
    """Engines built from the same models in different tests, files and xdist workers
    compile identical programs: one persistent cache for the whole run builds each once.
    It lives in the run's folder because JAX's cache key includes the cache's path (one
    folder per worker shared no entry). JAX writes an entry in place: a worker reading one
    mid-write warns and compiles the program itself."""
    import background
    from dsd_jax.compilation import enable_persistent_cache
    path = background.run_path("xla_cache")
    enable_persistent_cache(path)
    return path


@pytest.fixture(autouse=True)
def runtime_bound_programs(request):
    """The suite compiles at XLA's optimisation level 0 (`xla_flags.py`), for it is bound by
    compile time. A test marked `runtime_bound` runs its programs over thousands of rows (the
    statistical tests): its ahead-of-time compiles (every engine program) take level 1
    instead, whose code runs about 4x faster for about 1.4x the compile time (in one process,
    2026-12-01: the fixed-seed RL loop 188 s -> 70 s, the sampled-law test 91 s + 43 s -> 66 s
    + 29 s; the other statistical tests, fewer rows each, ran 10-50% slower so)."""
    if request.node.get_closest_marker("runtime_bound") is None:
        yield
        return
    compile = jax.stages.Lowered.compile

    def optimised(self, compiler_options=None, **kw):
        return compile(self, {"xla_backend_optimization_level": 1, **(compiler_options or {})}, **kw)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax.stages.Lowered, "compile", optimised)
        yield


@pytest.fixture(autouse=True)
def programs_of_its_own(request):
    """Engines alive together share compiled programs (`dsd_jax.shared_programs`), keyed by
    everything a program depends on but the library's code. A test that patches that code
    (`monkeypatch`), changes how programs compile (`runtime_bound`) or needs its engines to
    compile (`own_programs`) shares none, with the others or between its own engines. A test
    patching host-side code only (nothing a program traces) patches it with
    `pytest.MonkeyPatch.context()` instead, and keeps sharing."""
    from dsd_jax import shared_programs
    isolated = "monkeypatch" in request.fixturenames or any(
        request.node.get_closest_marker(m) for m in ("runtime_bound", "own_programs"))
    if not isolated:
        yield
        return
    with shared_programs.not_shared():
        yield


@pytest.fixture(scope="session")
def tiny_pair():
    target = models.init_model(tiny_config(), seed=0)
    draft = models.init_model(tiny_config(num_layers=1, hidden_size=16, intermediate_size=32,
                                          num_heads=2, num_kv_heads=1), seed=1)
    return target, draft


@functools.lru_cache(maxsize=None)
def _full_forward(graph, length):
    def run(params, tokens, n):
        pos = jnp.where(jnp.arange(length) < n, jnp.arange(length), -1)[None]
        kv = models.init_kv_cache(graph_config[graph], 1, length)
        logits, _ = models.forward(graph, params, tokens[None], pos, kv)
        return logits[0, n - 1]
    return jax.jit(run)


graph_config: dict = {}


def oracle_logits(model, tokens: list[int], length: int = 128) -> np.ndarray:
    """Next-token logits from a fresh full-sequence forward (no incremental KV cache)."""
    graph, params = nnx.split(model)
    graph_config[graph] = model.config
    padded = np.zeros(length, np.int32)
    padded[:len(tokens)] = tokens
    return np.asarray(_full_forward(graph, length)(params, padded, len(tokens)))


def greedy_reference(model, prompt: list[int], max_tokens: int, stop_ids=(), min_tokens=0) -> list[int]:
    """Greedy decoding by full forwards; `stop_ids` end it, and cannot be drawn before
    `min_tokens` tokens (vLLM's min_tokens)."""
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        logits = np.array(oracle_logits(model, seq))  # a copy: the ban writes into it
        if len(out) < min_tokens:
            logits[list(stop_ids)] = -np.inf
        tok = int(np.argmax(logits))
        out.append(tok)
        seq.append(tok)
        if tok in stop_ids:
            break
    return out


class FixedK:
    """A controller that plays a fixed K sequence (cycled); records what it saw."""

    def __init__(self, ks):
        self.ks = list(ks)
        self.calls = 0
        self.observed = []

    def choose_k(self, batch_size, context_len=None, request_ids=None):
        k = self.ks[self.calls % len(self.ks)]
        self.calls += 1
        return k

    def observe(self, k, num_accepted, step_time_s=None, request_ids=None, **kw):
        self.observed.append((k, np.asarray(num_accepted).copy()))


def make_engine(target, draft, controller=None, max_batch_size=4, max_seq_len=64, batch_buckets=None,
                tokenizer=None, **spec):
    """An engine with one batch bucket unless the test names them: each bucket is another
    set of step programs to compile (1-2 s each on XLA:CPU, most of the suite's time), and
    a row's tokens are the same in any bucket (tests/test_engine.py checks the buckets)."""
    from dsd_jax import SpecConfig, SpecEngine
    spec.setdefault("num_speculative_tokens", 4)
    buckets = (max_batch_size,) if batch_buckets is None else batch_buckets
    return SpecEngine(target, draft, SpecConfig(**spec), max_batch_size=max_batch_size,
                      max_seq_len=max_seq_len, prefill_chunk=16, batch_buckets=buckets, tokenizer=tokenizer,
                      controller=controller or FixedK([spec["num_speculative_tokens"]]))
