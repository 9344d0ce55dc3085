"""The bench's rollout alone with 6 rollout units instead of FULL's 3 (each its own 64 prompts
and seeded lengths; the rollout interval is a t interval over them): how wide the paired
intervals come out. s27's profile (`bench_full_s27.profile.json`), FULL's other settings.

    python benchmarks/results/rollout_units/rollout6.py > benchmarks/results/rollout_units/rollout6.log
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
from dsd_jax import bench, models  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
units = int(sys.argv[1]) if len(sys.argv) > 1 else 6
target, draft, tok = models.builtin()
rows = bench.run_bench(target, draft, tok, models.heldout_prompts(64 * units + 16),
                       configs="vanilla,static-1,static-2,dynamic", repeats=6, rollout_units=units,
                       workloads=("rollout",),
                       profile=os.path.join(here, "..", "bench_full_s27.profile.json"))
print(bench.format_table(rows), flush=True)
