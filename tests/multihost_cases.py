"""One process of a 2-process run under `jax.distributed` (localhost, gloo), started by
tests/test_multihost.py as `python multihost_cases.py PORT PROCESS_ID`. Each process has 2
CPU devices; the 2x2 mesh puts "data" across the processes and "model" within each.
Prints one JSON line of results; the assertions live in test_multihost.py."""

import json
import os
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "2"
sys.path.insert(0, os.path.dirname(__file__))
from xla_flags import use_fast_compile  # noqa: E402

use_fast_compile()

import jax  # noqa: E402

port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid,
                           cluster_detection_method="deactivate", initialization_timeout=120,
                           heartbeat_timeout_seconds=30, shutdown_timeout_seconds=30)

from multihost_prompts import COUPLED, GREEDY, PROMPTS, engine  # noqa: E402
from dsd_jax.sharding import make_mesh  # noqa: E402


class ClockDrivenK:
    """A controller whose K follows the step times it observes: left alone, two processes
    would soon want different K (each measures its own clock). Agreement must keep every
    dispatch on one K anyway. Like the library's controllers, it is deterministic in its
    inputs (what "allgather" relies on)."""

    def __init__(self):
        self.last = None

    def choose_k(self, batch_size, context_len=None, request_ids=None):
        return 1 if self.last is None else int(self.last * 1e6) % 3

    def observe(self, k, num_accepted, step_time_s=None, request_ids=None, context_len=None,
                **_):
        if step_time_s is not None:
            self.last = step_time_s


def run(strategy: str, params) -> dict:
    e = engine(make_mesh(2, 2), controller=ClockDrivenK(), multihost_strategy=strategy)
    e.warmup()  # so the agreement's waits measure the loop, not one process compiling
    dispatched = []
    step = e.programs.step

    def logged_step(k, b):
        dispatched.append(k)
        return step(k, b)

    e.programs.step = logged_step
    t0 = time.perf_counter()
    tokens = [o.token_ids for o in e.generate(PROMPTS, params)]
    wall = time.perf_counter() - t0
    a = e.agreement
    return {"tokens": tokens, "ks": dispatched, "wall_s": wall, "agree_calls": a.calls,
            "agree_s": a.seconds}


results = {"process": pid, "devices": jax.device_count(), "local": jax.local_device_count()}
results["broadcast"] = run("broadcast", GREEDY)
results["allgather"] = run("allgather", COUPLED)
# an engine on this process's own devices (no mesh, or a local one) runs no collective:
# no agreement, so each process runs its own requests (process 1 many more than process 0)
mine = PROMPTS[:1] if pid == 0 else PROMPTS
for name, m in (("local_mesh", make_mesh(1, 2, devices=jax.local_devices())), ("no_mesh", None)):
    e = engine(m)
    results[name] = {"agreement": e.agreement is not None,
                     "tokens": [o.token_ids for o in e.generate(mine, GREEDY)]}
# weights split over the processes ("model" across them): fingerprinting gathers them
results["fingerprints_model_across"] = engine(make_mesh(1, 4)).fingerprints()
try:  # a mesh over the first two devices holds none of process 1's
    engine(make_mesh(1, 2))
    results["foreign_mesh"] = None
except ValueError as err:
    results["foreign_mesh"] = str(err)
print("RESULTS " + json.dumps(results), flush=True)
jax.distributed.shutdown()
