"""What could any K policy win on the bench's rollout with this draft model? Bounds
from the per-position agreement (`agreement.py`) and the profile's step latency.

    python rollout_bound.py rollout.json PROFILE.json

Decode time only (the prefill is the same for every configuration), each step costing
the profile's ITL at its batch bucket and context. Printed, against K = 0 throughout:
every static K and dynamic (`sim.py`'s replay, dispatches and catch-up included); a
clairvoyant policy that picks each step's K knowing every row's agreement (the most
tokens per ms this step; no catch-up cost); and speculation for free (every step
accepts min(m, 6) drafts a row and costs a K = 0 step), which no policy can beat.
"""
import json
import sys

import numpy as np

import sim
from dsd_jax.buckets import bucket_for
from dsd_jax.profile import Profile


def replay(agreement, lens, budgets, itl, choose):
    """Decode ms with K = choose(batch bucket, context, [m of each live row]) every step."""
    pos = np.zeros(len(budgets), int)
    t = 0.0
    while (pos < budgets).any():
        live = np.flatnonzero(pos < budgets)
        bucket = bucket_for(len(live), sim.BUCKETS)
        context = int(max(lens[i] + pos[i] for i in live))
        # drafts past a row's budget gain nothing: count only what it may still emit
        m = np.array([min(agreement[i][pos[i]], budgets[i] - 1 - pos[i]) for i in live])
        k, cost = choose(itl(bucket, context), m)
        pos[live] += np.minimum(m, k) + 1
        t += cost
    return t


def clairvoyant(row, m):
    tokens = [np.sum(np.minimum(m, k) + 1) for k in range(len(row))]
    k = int(np.argmax(np.array(tokens) / row))
    return k, row[k]


def free(row, m):
    return len(row) - 1, row[0]


def main(rollout_path, profile_path):
    profile = Profile.load(profile_path)
    ro = json.load(open(rollout_path))
    (_, [(agreement, lens, budgets)]), = [p for p in sim.Workload(ro, ro, batch_sizes=()).points]
    lat = sim.ctl_latency(profile)
    itl = lambda b, c: lat.itl(b, lat.cached_context_key(c))  # noqa: E731
    budgets = np.array(budgets)
    base = replay(agreement, lens, budgets, itl, lambda row, m: (0, row[0]))
    print(f"K=0 throughout: {base:.0f} ms of decode ({len(budgets)} requests, {budgets.sum()} tokens)")
    w = sim.Workload(ro, ro, batch_sizes=())
    for name, make in [(f"static-{k}", (lambda k=k: sim.static_controller(k))) for k in range(1, 7)] + [
            ("dynamic", lambda: sim.make_dynamic(profile))]:
        t = sim.run(make, w, profile, repeats=2)["rollout"][-1][0]
        print(f"{name:24s} {base / t:.3f}x K=0's decode speed")
    for name, policy in (("clairvoyant K per step", clairvoyant), ("speculation for free", free)):
        print(f"{name:24s} {base / replay(agreement, lens, budgets, itl, policy):.3f}x")


if __name__ == "__main__":
    main(*sys.argv[1:])
