"""Dispatch rules the replay can price that the engine has not got (s31), against the policy
as it is, at a dispatch's measured cost on XLA:CPU:

    PYTHONPATH=. python dispatch_variants.py sweep.json ../bench_full_s28.profile.json --dispatch-ms 1.35

- `oracle`: the length rule knows what the dispatch in flight emits (the engine counts K + 1
  tokens a round for it, so a long dispatch is often followed by a one-round one): the most
  any estimate of those tokens could give.
- `bucketed`: the length rule waits for the row whose end shrinks the batch bucket, not the
  first row to end (rows that end early idle in a bucket that could not shrink anyway).
- `shared`: rounds timed as the engine times them for the controller's latency learning (a
  dispatch's wall, its own cost included, shared evenly by its rounds) instead of at the
  profile's ITL: whether the cost a one-round dispatch carries biases dynamic's choices.

Prints K = 0's time over each configuration's, as `sequence.py` does.
"""
from __future__ import annotations

import argparse
import json

import sequence
import sim
from dsd_jax.buckets import bucket_for
from dsd_jax.dispatch import DispatchPolicy
from dsd_jax.profile import Profile


def emitted(inflight) -> dict:
    """{row index: tokens} the dispatch in flight emits (the replay knows them in advance)."""
    out: dict = {}
    for running, acc in ([] if inflight is None else inflight.out):
        for i, a in zip(running, acc):
            out[i] = out.get(i, 0) + int(a) + 1
    return out


def room_policy(known: bool, bucketed: bool):
    """The policy with the length rule's room (`DispatchPolicy._room`) changed."""

    class Room(DispatchPolicy):
        def _room(self, live, inflight):
            if known:
                e = emitted(inflight)
                rem = sorted(self.remaining(r) - e.get(r.index, 0) for r in live)
            else:
                pending = 0 if inflight is None else inflight.rounds * (inflight.k + 1)
                rem = sorted(self.remaining(r) - pending for r in live)
            if not bucketed:
                return rem[0]
            lower = max([b for b in sim.BUCKETS if b < bucket_for(len(live), sim.BUCKETS)], default=0)
            return rem[len(live) - lower - 1]  # the row whose end leaves `lower` rows
    return Room


class SharedTiming(sim._Dispatch):
    """A dispatch whose rounds the controller observes at its wall shared evenly by them."""

    def __init__(self, snapshot, rounds, k, out, ms):
        super().__init__(snapshot, rounds, k, out, ms + sim.DISPATCH_MS / max(len(out), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("profile")
    args = sim.parse_replay_args(ap, "2,4,8")
    sweep = json.load(open(args.sweep))
    profile = Profile.load(args.profile)
    makers = {"static-0": lambda: sim.static_controller(0), "static-1": lambda: sim.static_controller(1),
              "static-2": lambda: sim.static_controller(2), "static-4": lambda: sim.static_controller(4),
              "dynamic": lambda: sim.make_dynamic(profile)}
    rules = {"": None, "+oracle": room_policy(True, False), "+bucketed": room_policy(False, True),
             "+bucketed-oracle": room_policy(True, True)}
    pure = sim._Dispatch
    for b in (int(x) for x in args.batch_sizes.split(",")):
        configs = {name + rule: sim.with_policy(make, policy) for name, make in makers.items() for rule, policy in rules.items()}
        print(sequence.summary(sweep, profile, b, args.orders, configs), flush=True)
        sim._Dispatch = SharedTiming
        print("  shared timing: " + sequence.summary(sweep, profile, b, args.orders, {
            "static-0": makers["static-0"], "dynamic": makers["dynamic"]}), flush=True)
        sim._Dispatch = pure


if __name__ == "__main__":
    main()
