"""Validate and time everything on one accelerator, in one command (issue 19).

    python benchmarks/device_check.py --out DIR            # on a GPU: a few minutes
    python benchmarks/device_check.py --out DIR --cpu-smoke  # tiny shapes, interpret mode, CPU

Writes DIR/device_check.json, DIR/device_check.txt (the report) and DIR/profile.json (the
real-shape ITL(B, K) profile), refusing a DIR that holds them from an earlier run unless
`--overwrite` is given. The sections and what each checks are described in
`dsd_jax.device_check`; `--sections kernels,timings` runs a subset. Exit status: 0 when
everything that ran passed, 1 when a section or an item raised or a correctness check
failed (the results and the report are written all the same), 2 for a bad flag (checked
before anything runs).
"""

import os
import sys

# before jax starts; the parser takes no abbreviations (allow_abbrev=False), so "--cpu" or
# "--cpu-s" is an error there, never a smoke run on the accelerator
if "--cpu-smoke" in sys.argv[1:]:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
# the profile section holds an 8B target, its draft and a 256-slot KV cache
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")

from dsd_jax.device_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
