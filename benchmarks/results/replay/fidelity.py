"""Does `sim.py` make the engine's decisions? Replays a traced bench run (`trace.py`) and
compares, run by run, dynamic's steps (K, live rows, mean accepted) with the trace's.

    python fidelity.py trace_b1.json sweep.json rollout.json PROFILE.json 1

(the last argument: the bench's --batch-sizes, comma-separated; its repeats are read
from the trace).
"""
import json
import sys

import sim
from dsd_jax.profile import Profile


def main(trace_path, sweep_path, rollout_path, profile_path, batch_sizes):
    profile = Profile.load(profile_path)
    sweep, rollout = (json.load(open(p)) for p in (sweep_path, rollout_path))
    workload = sim.Workload(sweep, rollout, batch_sizes=[int(b) for b in batch_sizes.split(",")])
    units = sum(len(u) for _, u in workload.points)
    real = [r for r in json.load(open(trace_path)) if r["config"] == "dynamic"]
    repeats = len(real) // units
    real = real[-repeats * units:]  # the bench's untimed warm-up run comes first
    replayed = []
    orig = sim.run_unit

    def traced(*args, **kwargs):
        trace = []
        t = orig(*args, **kwargs, trace=trace)
        replayed.append(trace)
        return t

    sim.run_unit = traced
    sim.run(lambda: sim.make_dynamic(profile), workload, profile, repeats=repeats)
    same = 0
    for i, (r, s) in enumerate(zip(real, replayed)):
        a = [(k, b, round(m, 2)) for k, b, m, *_ in r["steps"]]
        b = [(k, n, round(m, 2)) for k, n, m in s]
        same += a == b
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"run {i}: {len(a)} steps traced, {len(b)} replayed; first difference at step {first}: "
                  f"traced {a[first:first + 3]}, replayed {b[first:first + 3]}")
    print(f"identical step sequences: {same} of {len(real)} runs")


if __name__ == "__main__":
    main(*sys.argv[1:])
