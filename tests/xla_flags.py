"""XLA flags for the suite and its subprocesses.

The suite is bound by XLA:CPU compile time, not run time, and nothing in it is timed. A
lower backend optimisation level and the older elemental fusion emitters (not the
MLIR-based ones, which compile each fusion through their own pipeline) together build
the engine's programs 3x faster: 53 programs of a tiny pair in 11 s instead of 34 s
(25 s with the optimisation level alone), with the same tokens. The few tests that run
thousands of rows are bound by run time instead: marked `runtime_bound`, their programs
compile at level 1 (`conftest.py`).
"""

import os
import subprocess
import sys

OPT_LEVEL_0 = "--xla_backend_optimization_level=0"
OLD_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_ANSWER = "DSD_TEST_XLA_FLAGS"  # the probe's answer, inherited by the suite's subprocesses


def known(flags: str) -> bool:
    """Whether this XLA starts with `flags`: it aborts the process on a flag it does not
    know, so a child process tries them."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                          capture_output=True, timeout=300).returncode == 0


def fast_compile() -> str:
    """Both flags where this XLA still has the older emitters, else the optimisation level
    alone; asked once per suite run."""
    if _ANSWER not in os.environ:
        both = f"{OPT_LEVEL_0} {OLD_FUSION_EMITTERS}"
        os.environ[_ANSWER] = both if known(both) else OPT_LEVEL_0
    return os.environ[_ANSWER]


def use_fast_compile(extra: str = "") -> None:
    """Sets XLA_FLAGS to `fast_compile()` and `extra` for this process and its children,
    unless the caller set XLA_FLAGS; before the backend starts."""
    if "XLA_FLAGS" not in os.environ:
        os.environ["XLA_FLAGS"] = f"{fast_compile()} {extra}".strip()
