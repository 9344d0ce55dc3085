"""Dynamic with a held K = 0 stable at once (the engine's policy since s32, a candidate in s31)
against the policy before it (`HeldZeroWaits`: a held K = 0 waits for three equal choices and
runs 8 rounds a dispatch, since under the makespan objective it is never `settled`), at a
dispatch's measured cost on XLA:CPU:

    PYTHONPATH=. python held_zero.py sweep.json rollout.json ../bench_full_s28.profile.json --dispatch-ms 1.35

Prints K = 0's time over each configuration's: the sweep in random orders as `sequence.py`
does, then the bench's B=16 point and rollout as `sim.py` does (4 prompt orders).
`held_zero_s31.log` ran before s32, where "dynamic" was the policy before and
"dynamic-held0" the candidate; here they are "dynamic-s31" and "dynamic".
"""
from __future__ import annotations

import argparse
import json

import sequence
import sim
from dsd_jax.dispatch import DispatchPolicy
from dsd_jax.profile import Profile


class HeldZeroWaits(DispatchPolicy):
    """The policy before s32: only a held K > 0 is stable at once (`_holds`)."""

    def _holds(self, k):
        return k > 0 and super()._holds(k)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("rollout")
    ap.add_argument("profile")
    args = sim.parse_replay_args(ap, "1,2,4,8,16,32,64")
    sweep, rollout = (json.load(open(f)) for f in (args.sweep, args.rollout))
    profile = Profile.load(args.profile)
    dynamic = lambda: sim.make_dynamic(profile)  # noqa: E731
    configs = {"static-0": lambda: sim.static_controller(0), "static-1": lambda: sim.static_controller(1),
               "dynamic-s31": sim.with_policy(dynamic, HeldZeroWaits), "dynamic": dynamic}
    for b in (int(x) for x in args.batch_sizes.split(",")):
        print(sequence.summary(sweep, profile, b, args.orders, configs), flush=True)
    workloads = [sim.Workload(sweep, rollout, batch_sizes=(16,), seed=s) for s in range(4)]
    for name in ("static-1", "dynamic-s31", "dynamic"):
        print(f"{name:12s}", sim.summary(sim.speedups(configs[name], workloads, profile)), flush=True)


if __name__ == "__main__":
    main()
