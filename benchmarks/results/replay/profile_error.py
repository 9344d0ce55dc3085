"""What the profile's latency error costs dynamic: the replay with the K choices made from
one profile and every step priced by another (the bench's measured step times).

    python profile_error.py BENCH.json PROFILE.json sweep.json rollout.json [SEEDS]

The measured table: the median decode-step time of every (batch bucket, K) the bench's
vanilla and static-K runs measured (`step_calibration` of its rows; K = 5, which no
static configuration ran, interpolated), at the profile's one context length.
"""
import json
import sys

import numpy as np

import sim
from dsd_jax.profile import Profile


def measured_profile(bench_rows, profile):
    """A copy of `profile` whose ITL table is the bench's measured step times."""
    table = np.full((len(profile.batch_sizes), len(profile.ks)), np.nan)
    for r in bench_rows:
        if r.get("workload") != "sweep" or not (r["config"] == "vanilla" or r["config"].startswith("static-")):
            continue
        for c in r.get("step_calibration") or []:
            if c["bucket"] == r["batch_size"] and c["bucket"] in profile.batch_sizes:  # not a point's tail
                table[profile.batch_sizes.index(c["bucket"]), c["k"]] = c["measured_ms"]
    for row in table:  # K the bench never ran: linear between its neighbours
        known = ~np.isnan(row)
        row[~known] = np.interp(np.flatnonzero(~known), np.flatnonzero(known), row[known])
    d = profile.to_dict()
    d["latency_ms"] = [table.tolist()] * len(profile.context_lengths)
    return Profile.from_dict(d), table


def main(bench_path, profile_path, sweep_path, rollout_path, seeds="6"):
    rows = json.load(open(bench_path))["rows"]
    profile = Profile.load(profile_path)
    truth, table = measured_profile(rows, profile)
    prof = np.array(profile.latency_ms)[0]
    print("profiled / measured ITL, per batch bucket, K = 0..6:")
    for b, p, m in zip(profile.batch_sizes, prof, table):
        print(f"  B={b:2d} " + " ".join(f"{x:.2f}" for x in p / m))
    sweep, rollout = (json.load(open(p)) for p in (sweep_path, rollout_path))
    ws = [sim.Workload(sweep, rollout)] + [sim.Workload(sweep, rollout, seed=s) for s in range(int(seeds))]
    print("speedup over K=0, every step priced at the measured times:")
    for k in range(7):
        print(f"  static-{k:<3d}", sim.summary(sim.speedups(lambda k=k: sim.static_controller(k), ws, truth)))
    print("  dynamic, K from the profile ", sim.summary(sim.speedups(lambda: sim.make_dynamic(profile), ws, truth)))
    print("  dynamic, K from the measured", sim.summary(sim.speedups(lambda: sim.make_dynamic(truth), ws, truth)))


if __name__ == "__main__":
    main(*sys.argv[1:])
