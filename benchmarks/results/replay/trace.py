"""Per-prompt traces of a bench run: every step's K and accepted count for each run of
each configuration, written as JSON beside the bench's own output.

    python trace.py TRACE.json bench --configs vanilla,static-6,dynamic --batch-sizes 1 ...
"""
import json
import sys

from dsd_jax.bench import runner as R

out_path, argv = sys.argv[1], sys.argv[2:]
records = []
orig = R.Runner.run


def run(self, config, prompts, sampling):
    wall, outs, info = orig(self, config, prompts, sampling)
    st = self.engine_for(config).stats
    records.append({"config": config, "prompt": [list(p[:8]) for p in prompts], "wall_s": wall,
                    "tokens": sum(len(o) for o in outs),
                    "steps": [(t["k"], t["batch_size"], t["mean_accepted"], t["wall_ms"], t["after_prefill"]) for t in st.trace]})
    return wall, outs, info


R.Runner.run = run
from dsd_jax.cli import main  # noqa: E402

rc = main(argv)
with open(out_path, "w") as f:
    json.dump(records, f)
sys.exit(rc)
