"""The tests' mesh job with every compiled program waited for (`Compiled.__call__`
patched to block on its outputs), to run beside other processes:

    python mesh_waiting.py      # from anywhere; prints the job's RESULTS line

Beside two test files on 2 cores (2026-11-29) it finished twice without a stuck
rendezvous: 218 s beside two at nice 19, 386 s beside two at normal priority. Unwaited,
it hung twice in two tries beside two at nice 19 (docs/design.md, section 11)."""
import os
import runpy
import sys

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests")
sys.path.insert(0, TESTS)
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "4"

import jax  # noqa: E402
from jax._src import stages  # noqa: E402

_call = stages.Compiled.__call__


def call_and_wait(self, *args, **kwargs):
    out = _call(self, *args, **kwargs)
    jax.block_until_ready(out)
    return out


stages.Compiled.__call__ = call_and_wait
sys.argv = [os.path.join(TESTS, "mesh_cases.py")]
runpy.run_path(sys.argv[0], run_name="__main__")
