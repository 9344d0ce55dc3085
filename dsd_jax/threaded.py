"""Many threads calling one engine at once: their requests share one running batch.

An agentic RL loop (Tunix's `AgenticRLLearner`: up to `max_concurrency` episodes, each
calling the rollout from its own thread for every turn) or a server sends requests from
many threads while others are still decoding. `SpecEngine` runs one `generate` at a time
(a second raises: it would take the first's slots), so calling it from threads would have
to wait in turn, one conversation per step. `ThreadedEngine` is the thread-safe front:

    front = ThreadedEngine(engine)
    outputs = front.generate(prompts, sampling)      # from any number of threads at once

Each call's inputs are checked in its own thread (a bad request raises there and nothing
is queued), its requests are numbered and put in an inbox, and the call waits. One driver
thread runs the engine's loop (`SpecEngine._run` with `arrivals`): before each admission it
takes what the inbox holds, so requests arriving while others decode join the next
admission as slots free up (continuous batching across callers), and the step runs them
together. The driver starts a run `gather_s` after the first call reaches an idle front,
so that calls arriving together (a batch of episodes starting at once) share its first
admission instead of joining a step later with a prefill of their own; it stops when
nothing is left.

Each call's outputs are its own, in its prompt order. What a request generates does not
depend on the other calls' requests where it never does in one `generate`: greedy
output, and sampling under `acceptance="drafter_invariant"` (token-identical to plain
sampling with the request's seed). Under rejection acceptance each completion is still an
exact sample; its tokens depend on the batch it ran in. Unseeded requests take seeds from
their request ids, numbered in the order calls arrive.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from dsd_jax.request import remember
from dsd_jax.sampling import SamplingParams


# How long an idle front waits after a first call before starting a run: 8 threads started
# in a loop all arrive within it on this CPU (`benchmarks/results/threaded/ab.py`), a small
# latency beside a prefill.
GATHER_S = 0.002


class _Call:
    """One `generate` call's requests and what its thread waits on."""

    def __init__(self, requests: list):
        self.requests = requests
        self.left = len(requests)
        self.done = threading.Event()
        self.error: BaseException | None = None


class ThreadedEngine:
    """A thread-safe `generate` over one `SpecEngine` (module docstring). The engine itself
    must not be called directly while calls are running here (its own `generate` would
    raise, as for any second run)."""

    def __init__(self, engine, gather_s: float = GATHER_S):
        if not 0 <= gather_s <= 1:
            raise ValueError(f"gather_s must be between 0 and 1 second, got {gather_s!r}")
        self.engine = engine
        self.gather_s = gather_s
        self._lock = threading.Lock()  # the inbox, the driver's state, the engine's numbering
        self._changed = threading.Condition(self._lock)  # a run ended, or took calls
        self._running = False  # inside the engine's run
        self._taken = 0  # calls the runs took so far
        self._inbox: list[_Call] = []
        self._idle = threading.Event()  # set while no driver thread runs
        self._idle.set()
        self._calls_of: dict[int, _Call] = {}  # request id -> its call, while it runs
        self.runs = 0  # engine runs started: calls that overlap share one

    def generate(self, prompts, sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 return_logprobs: bool = False, references=None, memory=None) -> list:
        """`SpecEngine.generate`'s outputs for these prompts, run beside every other call
        in flight. Raises what the run raised if it failed while this call's requests were
        in it."""
        with self._lock:  # checks read the memory other calls write
            call = _Call(self.engine._make_requests(
                self.engine._check_call(prompts, sampling, references, memory)))
            if not call.requests:  # no prompts: nothing would ever finish it
                return []
            self._inbox.append(call)
            if self._idle.is_set():
                self._idle.clear()
                threading.Thread(target=self._drive, name="dsd_jax-driver", daemon=True).start()
        call.done.wait()
        with self._lock:
            if not self._calls_of and not self._inbox:
                # the last call out returns once its run has closed (or a new call joined
                # it): a caller going on alone may then use the engine directly
                taken = self._taken
                self._changed.wait_for(lambda: not self._running or self._taken != taken)
            if call.error is not None:
                raise call.error
            remember(memory, call.requests)
        return [self.engine._output(r, return_logprobs) for r in call.requests]

    def join(self, timeout: float | None = None) -> bool:
        """Waits until no call is left to run: the engine then takes direct calls again.
        False on timeout."""
        return self._idle.wait(timeout)

    def _arrivals(self) -> list:
        """The requests of every call in the inbox (the driver's loop, before an admission)."""
        with self._lock:
            calls, self._inbox = self._inbox, []
            for call in calls:
                for r in call.requests:
                    self._calls_of[r.request_id] = call
            if calls:
                self._taken += len(calls)
                self._changed.notify_all()
        return [r for call in calls for r in call.requests]

    def _drive(self) -> None:
        """Runs the engine while calls are waiting; each run ends when nothing is left."""
        while True:
            time.sleep(self.gather_s)  # calls arriving together share the first admission
            with self._lock:
                if not self._inbox:
                    self._idle.set()
                    return
                self._running = True
            self.runs += 1
            try:
                for r, _ in self.engine._run([], arrivals=self._arrivals):
                    if r.finish_reason is not None:
                        with self._lock:
                            call = self._calls_of.pop(r.request_id)
                            call.left -= 1
                        if call.left == 0:
                            call.done.set()
            except BaseException as e:  # every waiting call gets the error (a run that
                with self._lock:         # could not start would fail each retry alike)
                    failed = list({id(c): c for c in self._calls_of.values()}.values()) + self._inbox
                    self._calls_of.clear()
                    self._inbox = []
                for call in failed:
                    call.error = e
                    call.done.set()
            finally:
                with self._lock:
                    self._running = False
                    self._changed.notify_all()
