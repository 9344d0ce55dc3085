"""Validate and time everything on one accelerator, in one command (issue 19).

    python benchmarks/device_check.py --out DIR            # on a GPU: a few minutes
    python benchmarks/device_check.py --out DIR --cpu-smoke  # tiny shapes, interpret mode, CPU

Writes DIR/device_check.json, DIR/device_check.txt (the report) and DIR/profile.json (the
real-shape ITL(B, K) profile). The sections and what each checks are described in
`dsd_jax.device_check`; `--sections kernels,timings` runs a subset.
"""

import os
import sys

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
# the profile section holds an 8B target, its draft and a 256-slot KV cache
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")

from dsd_jax.device_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
