"""The replay at a bench run's own step times: its profile with each (batch bucket, K) cell
scaled by the ratio of the step time a controller learnt online in that run to the profiled
ITL (the bench log's table "CONFIG's learnt step time / profiled ITL per batch bucket").

The live steps run 0-14% off the profile, unevenly over K, and the replay's verdicts on
changes of 1-2% disagreed in sign with three bench A/Bs until the replay used them
(`../fresh_row_draft/`). Controllers still price with the profile; the steps cost
`measured_profile(...)`'s ITL, and the controllers learn those step times as in the bench.
"""
import json
import re
import tempfile

import numpy as np

from dsd_jax.profile import Profile


def learnt_ratios(log_path: str, config: str = "dynamic-throughput") -> dict[int, list[float]]:
    """{batch bucket: [ratio at K = 0, 1, ...]} from `config`'s learnt-step-time table in a
    bench log (the controller without the change under test, in an A/B's log)."""
    lines = open(log_path).read().splitlines()
    head = next((i for i, line in enumerate(lines)
                 if line.startswith(f"{config}'s learnt step time / profiled ITL")), None)
    if head is None:
        raise ValueError(f"{log_path} has no learnt step-time table for {config!r}")
    ratios = {}
    for line in lines[head + 1:]:
        m = re.match(r"^\s+(\d+) \|((?: [\d.]+)+)\s*$", line)
        if not m:
            break
        ratios[int(m.group(1))] = [float(x) for x in m.group(2).split()]
    return ratios


def measured_profile(profile_path: str, ratios: dict[int, list[float]]) -> Profile:
    """The profile at `profile_path` with each cell times its bucket's and K's ratio."""
    raw = json.load(open(profile_path))
    scale = np.array([ratios[b][: len(raw["ks"])] for b in raw["batch_sizes"]])
    raw["latency_ms"] = (np.array(raw["latency_ms"]) * scale[None]).tolist()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(raw, f)
    return Profile.load(f.name)
