"""The K = 0 step program of plain decoding's engine against the draft-model engine's
(built-in pair, one batch bucket, max_seq_len 448): instruction counts of the compiled
HLO, each written to /tmp/k0_<engine>_<B>.hlo for a diff.

    python benchmarks/results/k0_overhead/hlo.py 64
"""
import collections
import re
import sys

from dsd_jax import SpecConfig, SpecEngine
from dsd_jax.models import builtin

B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
target, draft, _ = builtin()
common = dict(max_batch_size=B, batch_buckets=[B], max_seq_len=448)
engines = {"vanilla": SpecEngine(target, None, SpecConfig(method="none"), **common),
           "draft_model": SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=1),
                                     **common)}
for name, engine in engines.items():
    text = engine.programs.step(0, B).as_text()
    ops = collections.Counter(re.findall(r"= \S+ ([a-z-]+)\(", text))
    print(name, "instructions", sum(ops.values()),
          {k: ops[k] for k in ("parameter", "copy", "fusion", "dot", "scatter", "dynamic-update-slice")})
    with open(f"/tmp/k0_{name}_{B}.hlo", "w") as f:
        f.write(text)
