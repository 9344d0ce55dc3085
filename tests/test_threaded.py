"""ThreadedEngine: `generate` from many threads at once, their requests in one running batch
(as Tunix's agentic learner calls its rollout, one thread per episode)."""

import threading
import time

import pytest

from conftest import FixedK, make_engine
from dsd_jax import SamplingParams
from dsd_jax.threaded import ThreadedEngine

PROMPTS = [[1, 2, 3], [5, 9], [7, 8, 9, 10, 11, 12], [3, 3, 9, 3], [4, 6], [9, 9, 9, 1]]


class GatedK(FixedK):
    """FixedK whose first choice waits for `gate`: the first call's requests are admitted
    and the others are all in the inbox before anything is dispatched."""

    def __init__(self, ks, gate):
        super().__init__(ks)
        self.gate = gate

    def choose_k(self, *args, **kw):
        if self.calls == 0:
            assert self.gate.wait(120), "the test never opened the gate"
        return super().choose_k(*args, **kw)


def run_threads(front, calls) -> list:
    """front.generate(*args, **kw) for each call in its own thread: what each returned or raised."""
    results = [None] * len(calls)

    def one(i, args, kw):
        try:
            results[i] = front.generate(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            results[i] = e

    threads = [threading.Thread(target=one, args=(i, args, kw), daemon=True)  # a hung one fails, not stalls
               for i, (args, kw) in enumerate(calls)]
    for t in threads:
        t.start()
    return threads, results


def waiting(front) -> int:
    with front._lock:
        return sum(len(c.requests) for c in front._inbox)


def wait_until(condition, what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def engine(tiny_pair):
    target, draft = tiny_pair
    return make_engine(target, draft, method="draft_model", acceptance="drafter_invariant",
                       batch_buckets=(1, 2, 4), max_batch_size=4)


def test_concurrent_calls_share_the_batch_and_get_what_one_call_each_gets(engine):
    """Five calls from five threads (one with two prompts, one sampled with a seed, one
    with n=2): the four slots run them together from the second step on, each call gets its
    own outputs in its prompt order, equal to what the engine gives each call alone
    (greedy, and sampling under drafter-invariant acceptance); the engine refuses a direct
    call while the front runs."""
    calls = [((PROMPTS[0:1], SamplingParams(temperature=0.0, max_tokens=9)), {}),
             ((PROMPTS[1:3], SamplingParams(temperature=0.0, max_tokens=6)), {"return_logprobs": True}),
             ((PROMPTS[3:4], SamplingParams(temperature=1.0, max_tokens=12, seed=5)), {}),
             ((PROMPTS[4:5], SamplingParams(temperature=0.8, max_tokens=7, seed=9, n=2)), {}),
             ((PROMPTS[5:6], SamplingParams(temperature=0.0, max_tokens=3)), {})]
    gate = threading.Event()
    engine.controller = GatedK([2, 0, 3], gate)
    engine.reset_metrics()
    front = ThreadedEngine(engine)
    threads, first = run_threads(front, calls[:1])
    # the first call's request is in the run, which holds before its first dispatch
    wait_until(lambda: waiting(front) == 0 and engine._run_lock.locked(), "the first call runs")
    with pytest.raises(RuntimeError, match="already running"):
        engine.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
    more, rest = run_threads(front, calls[1:])
    wait_until(lambda: waiting(front) == 6, "the other calls' 6 requests wait")
    gate.set()
    end = time.monotonic() + 120
    for t in threads + more:
        t.join(max(end - time.monotonic(), 0))
    assert not any(t.is_alive() for t in threads + more)
    results = first + rest
    assert all(not isinstance(r, BaseException) for r in results), results
    # one run: the calls made while the first one decoded joined it at the next step,
    # four rows from then on
    assert front.runs == 1 and [t["batch_size"] for t in list(engine.stats.trace)[:2]] == [1, 4]
    assert front.join(120)  # the run has closed: the engine takes direct calls
    engine.controller = FixedK([2, 0, 3])
    for (args, kw), got in zip(calls, results):
        alone = engine.generate(*args, **kw)
        assert [o.token_ids for o in got] == [o.token_ids for o in alone]
        assert [o.prompt_index for o in got] == [o.prompt_index for o in alone]
        if kw.get("return_logprobs"):
            for o, a in zip(got, alone):
                assert o.logprobs == pytest.approx(a.logprobs, abs=1e-5)


def test_a_bad_call_raises_in_its_own_thread_and_queues_nothing(engine):
    engine.controller = FixedK([2])
    front = ThreadedEngine(engine)
    good = [((PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=5)), {})] * 2
    bad = [((PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=[64])), {}),
           (([[]], SamplingParams(max_tokens=5)), {})]
    threads, results = run_threads(front, good + bad)
    for t in threads:
        t.join(120)
    assert [len(r) for r in results[:2]] == [2, 2]
    assert isinstance(results[2], ValueError) and "stop_token_ids" in str(results[2])
    assert isinstance(results[3], ValueError) and "empty" in str(results[3])
    assert front.join(120) and not front._inbox and not front._calls_of
    threads, results = run_threads(front, [(([], SamplingParams()), {})])  # as engine.generate([])
    threads[0].join(60)
    assert results == [[]]


def test_a_failed_run_reaches_every_waiting_call_and_the_next_calls_run(engine, monkeypatch):
    """A step that raises fails every call in the run and every call waiting for one (each
    retry would fail alike); the front then serves new calls (the engine freed its slots)."""
    gate = threading.Event()
    engine.controller = GatedK([2], gate)
    front = ThreadedEngine(engine)
    step = engine.programs.step

    def broken(*args):
        raise RuntimeError("device lost")
    monkeypatch.setattr(engine.programs, "step", broken)
    threads, results = run_threads(front, [((PROMPTS[:1], SamplingParams(max_tokens=4)), {})])
    wait_until(lambda: waiting(front) == 0 and engine._run_lock.locked(), "the first call runs")
    more, rest = run_threads(front, [((PROMPTS[1:3], SamplingParams(max_tokens=4)), {})] * 2)
    wait_until(lambda: waiting(front) == 4, "the other calls wait")
    gate.set()
    for t in threads + more:
        t.join(120)
    assert all(isinstance(r, RuntimeError) and "device lost" in str(r) for r in results + rest), results + rest
    monkeypatch.setattr(engine.programs, "step", step)
    engine.controller = FixedK([2])
    out = front.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=4))
    assert front.join(120)
    assert [o.token_ids for o in out] == [o.token_ids for o in engine.generate(
        PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=4))]


def test_calls_arriving_within_the_gather_window_share_the_first_admission(engine):
    """An idle front starts its run `gather_s` after the first call: two calls made 0.3 s
    after it are in its first step with it (with no window the first call is admitted
    alone and they join a step later, with a prefill of their own). A window outside
    [0, 1] s is refused."""
    engine.controller = FixedK([2])
    engine.reset_metrics()
    front = ThreadedEngine(engine, gather_s=1.0)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    threads, results = run_threads(front, [(([PROMPTS[0]], params), {})])
    time.sleep(0.3)
    more, rest = run_threads(front, [(([p], params), {}) for p in PROMPTS[1:3]])
    for t in threads + more:
        t.join(120)
    assert all(isinstance(r, list) for r in results + rest), results + rest
    assert front.runs == 1 and list(engine.stats.trace)[0]["batch_size"] == 3
    for bad in (-0.1, 2.0):
        with pytest.raises(ValueError, match="gather_s"):
            ThreadedEngine(engine, gather_s=bad)
