"""One K for every process of a multi-host run (`jax.distributed`).

Every process runs the same host loop over the same requests, and every step program is
one SPMD program over all of them: processes dispatching different K would run different
programs and deadlock in their collectives. The loop's inputs are identical everywhere
(the step outputs come back replicated) except the wall clock: each process measures its
own step times, and the controller learns latency from them, so its K could drift apart.

Two ways to agree, both through the coordination service's key-value store (host to
host): a device collective would queue behind the step still in flight, and the host
would lose the one-step lead that hides it.

- "broadcast": process 0's controller decides each dispatch's K; the others read it.
- "allgather": every process publishes each measured step time and all of them use the
  slowest, so every controller sees the same inputs and takes the same decisions itself.
"""

from __future__ import annotations

import itertools
import time

import jax

STRATEGIES = ("broadcast", "allgather")
TIMEOUT_MS = 120_000  # a process this far behind has failed; say so instead of hanging
_KEEP = 64  # keys kept per namespace before the oldest are deleted (processes stay within a
# dispatch or two of each other: every step program synchronises them)
_namespaces = itertools.count()  # engines are built in the same order on every process


def _client():
    from jax._src import distributed  # the coordination service's client (no public handle)
    return distributed.global_state.client


class Agreement:
    """Keeps the host loops of all processes on the same K. `seconds` and `calls` count
    the time spent agreeing (see benchmarks/results for the two strategies' costs)."""

    def __init__(self, strategy: str = "broadcast", client=None, process_id: int | None = None,
                 num_processes: int | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"multihost strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        self.client = client if client is not None else _client()
        if self.client is None:
            raise RuntimeError("multi-host agreement needs jax.distributed.initialize() first")
        self.process_id = jax.process_index() if process_id is None else process_id
        self.num_processes = jax.process_count() if num_processes is None else num_processes
        self.prefix = f"dsd_jax/{next(_namespaces)}"
        self._n = itertools.count()
        self.calls = 0
        self.seconds = 0.0

    def _key(self, what: str, n: int, process: int = 0) -> str:
        return f"{self.prefix}/{what}/{n}/{process}"

    def _get(self, key: str) -> str:
        try:
            return self.client.blocking_key_value_get(key, TIMEOUT_MS)
        except Exception as err:  # the client raises a bare runtime error on timeout
            raise RuntimeError(f"process {self.process_id} waited {TIMEOUT_MS / 1000:.0f} s for "
                               f"{key!r} from another process: {err}") from err

    def _forget(self, what: str, n: int) -> None:
        if n >= _KEEP:  # each process deletes its own old keys
            self.client.key_value_delete(self._key(what, n - _KEEP, self.process_id))

    def k(self, decide) -> int:
        """The dispatch's K: `decide()` (the local controller) under "allgather", where every
        controller has the same inputs; process 0's `decide()` under "broadcast"."""
        if self.strategy == "allgather":
            return int(decide())
        t0 = time.perf_counter()
        n = next(self._n)
        if self.process_id == 0:
            k = int(decide())
            self.client.key_value_set(self._key("k", n), str(k))
            self._forget("k", n)
        else:
            k = int(self._get(self._key("k", n)))
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        return k

    def step_time(self, seconds: float | None) -> float | None:
        """The step time the controller observes: the slowest process's under "allgather"
        (every process calls this for the same rounds: the loop is the same everywhere)."""
        if self.strategy != "allgather" or seconds is None:
            return seconds
        t0 = time.perf_counter()
        n = next(self._n)
        self.client.key_value_set(self._key("t", n, self.process_id), repr(float(seconds)))
        slowest = max(float(self._get(self._key("t", n, p))) for p in range(self.num_processes))
        self._forget("t", n)
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        return slowest


def agreement(strategy: str, mesh=None) -> Agreement | None:
    """An `Agreement` when the engine's mesh spans several processes, else None: an engine
    on this process's devices alone (no mesh, or a local one) runs no collective, so each
    process may run its own requests without waiting on the others."""
    if strategy not in STRATEGIES:
        raise ValueError(f"multihost strategy must be one of {STRATEGIES}, got {strategy!r}")
    if jax.process_count() == 1 or mesh is None:
        return None
    processes = {d.process_index for d in mesh.devices.flat}
    if jax.process_index() not in processes:
        raise ValueError(f"the mesh holds none of this process's devices (process {jax.process_index()}; "
                         f"its devices are on processes {sorted(processes)}): under jax.distributed "
                         f"every process runs the engine on its own devices of the mesh "
                         f"(`make_mesh` over jax.devices() takes every process's)")
    return Agreement(strategy) if len(processes) > 1 else None
