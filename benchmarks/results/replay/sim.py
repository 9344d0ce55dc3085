"""A noise-free replay of the bench (greedy sweep and rollout) under any K controller.

    python sim.py sweep.json rollout.json PROFILE.json

With greedy drafting a step at position p with K drafts accepts min(m[p], K), m from
`agreement.py`; a step costs the profile's ITL at its batch bucket and context, plus the
draft's catch-up from the profile's `catchup_ms`: a K > 0 round first takes in, in
32-token chunks, what its rows emitted since their last K > 0 round (their prompts too
when admission left the draft out because the controller held K = 0:
`SpecEngine._draft_now`). The engine's dispatches are replayed with its own
`DispatchPolicy` (K, rounds, the draft at admission, no dispatch behind one that finishes
every live row), one dispatch in flight: the controller chooses the next K before it has
seen the last dispatch's rounds. (Until s31 the replay mimicked the policy in its own code.)
Prefill, step-time noise and the host's own time are left out: this ranks controller
rules (one controller through every point, as in the bench), the bench A/B judges them.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
from types import SimpleNamespace

import numpy as np

from dsd_jax.bench.settings import resolve
from dsd_jax.bench.workloads import prompt_groups, rollout_lengths
from dsd_jax.buckets import bucket_for
from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.dispatch import DispatchPolicy
from dsd_jax.profile import Profile

BUCKETS = [1, 2, 4, 8, 16, 32, 64]
MAX_K = 6  # the engine's largest K: the bench's controllers share one engine
# A dispatch's own cost beside its rounds. Issue 13 took the host's part (~1% at 32 rounds);
# measured on XLA:CPU in the engine it is ~1.3-1.4 ms (`../controller_host/`, s29-s30), and
# what the replay says at B >= 2 depends on it (`sequence.py --dispatch-ms`).
DISPATCH_MS = 0.05


def make_dynamic(profile, max_k=6, **dynamic):
    spec = SpecConfig(method="draft_model", num_speculative_tokens=max_k,
                      dynamic=DynamicConfig(objective="makespan", **dynamic))
    return Controller(spec, profile, 64, batch_buckets=BUCKETS)


def with_policy(make, policy):
    """A factory of `make()`'s controller that `run_unit` dispatches under `policy` (a
    `DispatchPolicy` subclass; None: the engine's own)."""
    def make_under():
        ctl = make()
        if policy is not None:
            ctl.dispatch_policy = policy
        return ctl
    return make_under


def parse_replay_args(ap, batch_sizes: str):
    """Adds what every sweep replay in random orders takes, --batch-sizes (default
    `batch_sizes`), --orders (6) and --dispatch-ms (1.35: a dispatch's cost in the engine on
    XLA:CPU, `../controller_host/`), parses the command line and prices dispatches at it."""
    global DISPATCH_MS
    ap.add_argument("--batch-sizes", default=batch_sizes)
    ap.add_argument("--orders", type=int, default=6)
    ap.add_argument("--dispatch-ms", type=float, default=1.35)
    args = ap.parse_args()
    DISPATCH_MS = args.dispatch_ms
    return args


def static_controller(k):
    """The bench's static-K controller (K = 0: plain decoding's)."""
    spec = SpecConfig(method="draft_model", num_speculative_tokens=k) if k else SpecConfig(method="none")
    return Controller(spec, None, 64, batch_buckets=BUCKETS)


def catchup_ms(profile, bucket, tokens):
    """The draft's catch-up of `tokens` positions at a batch bucket (profile's chunks)."""
    c = profile.catchup_ms
    if not c or tokens <= 0:
        return 0.0
    return -(-tokens // c["chunk"]) * float(np.interp(bucket, profile.batch_sizes, c["ms"]))


class _Row:
    """What `DispatchPolicy` reads of a request: its id, its stop strings (none here), its
    prompt's length and the tokens the host has of it (`host[index]`)."""

    params = SimpleNamespace(stop=())

    def __init__(self, index: int, request_id: int, host: np.ndarray, prompt_len: int):
        self.index, self.request_id, self._host = index, request_id, host
        self.prompt = range(prompt_len)  # its length is what the policy reads

    @property
    def tokens(self):
        return range(int(self._host[self.index]))


@dataclasses.dataclass
class _Dispatch:
    """A dispatch in flight: its rows (`snapshot`), rounds and K as `DispatchPolicy` reads
    them, and what its rounds accepted (`out`: (running rows, accepted) a round) at `ms` a round."""

    snapshot: list
    rounds: int
    k: int
    out: list
    ms: float


def run_unit(ctl, agreement, prompt_lens, ids, budgets, profile, trace=None):
    """Simulated ms for one generate of these rows (agreement rows, per-row budgets)."""
    lat = ctl_latency(profile)
    n = len(agreement)
    budgets = np.asarray(budgets)
    pos = np.zeros(n, int)  # tokens emitted on the device
    host = np.zeros(n, int)  # tokens the host has processed
    done = np.zeros(n, bool)  # finished, as the host knows
    rows = [_Row(i, ids[i], host, prompt_lens[i]) for i in range(n)]
    # the engine's own dispatch policy (a variant's controller may carry a subclass: `sequence.py --variants`)
    policy = getattr(ctl, "dispatch_policy", DispatchPolicy)(ctl, MAX_K, None, lambda r: int(budgets[r.index]))
    # admission prefills the draft only where the controller would speculate
    draft_now = policy.draft_at_admission(n, rows, refilled=False)
    lag = np.zeros(n, int) if draft_now else np.array(prompt_lens)  # positions the draft has not taken in
    inflight, prefilled, t = None, True, 0.0
    while (~done).any() or inflight:
        live = np.flatnonzero(~done)
        live_rows = [rows[i] for i in live]
        dispatched = None
        if len(live) and not policy.finishes_in_flight(live_rows, inflight):
            b = len(live)
            context = int(max(prompt_lens[i] + host[i] for i in live))
            k = policy.choose_k(live_rows, b, context, refilled=False)
            rounds = policy.rounds(live_rows, k, False, inflight, b, context, after_prefill=prefilled)
            prefilled = False
            bucket = bucket_for(b, BUCKETS)
            step_ms = float(lat.itl(bucket, lat.cached_context_key(context))[k])
            rounds_out = []
            for _ in range(rounds):
                running = [i for i in live if pos[i] < budgets[i]]
                if not running:
                    break
                if k > 0:
                    t += catchup_ms(profile, bucket, int(max(lag[i] for i in running)))
                    lag[running] = 0
                # the engine accepts what matches and emits only up to the row's budget
                acc = np.array([min(agreement[i][pos[i]], k) for i in running])
                for i, a in zip(running, acc):
                    pos[i] = min(pos[i] + a + 1, budgets[i])
                    if k == 0:
                        lag[i] += 1
                rounds_out.append((running, acc))
                t += step_ms
            t += DISPATCH_MS
            dispatched = _Dispatch(live_rows, rounds, k, rounds_out, step_ms)
        if inflight:
            for running, acc in inflight.out:
                ctl.observe(inflight.k, acc, step_time_s=inflight.ms / 1e3, request_ids=[ids[i] for i in running])
                for i, a in zip(running, acc):
                    host[i] = min(host[i] + a + 1, budgets[i])
                if trace is not None:
                    trace.append((inflight.k, len(running), float(np.mean(acc))))
            for i in (r.index for r in inflight.snapshot):
                if host[i] >= budgets[i] and not done[i]:
                    done[i] = True
                    forget = getattr(ctl, "forget_request", None)
                    if forget:
                        forget(ids[i])
        inflight = dispatched if (~done).any() else None
    return t


_LATENCY: list = []  # (profile, its ITL model): the profile kept alive, so `is` identifies it


def ctl_latency(profile):
    """The profile's ITL model (the controller's own, without learning)."""
    for p, model in _LATENCY:
        if p is profile:
            return model
    _LATENCY.append((profile, make_dynamic(profile)._latency))
    return _LATENCY[-1][1]


class Workload:
    """The bench's points (full mode) over the agreement files; `seed` permutes the sweep's
    prompts (None: the bench's order)."""

    def __init__(self, sweep, rollout, batch_sizes=(1, 2, 4, 8, 16, 32, 64), seed=None):
        s = resolve(False, {"batch_sizes": list(batch_sizes) or [1], "workloads": ("sweep", "rollout")}, 448)
        n = len(sweep["agreement"])
        order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
        self.points = []
        for b in batch_sizes:
            groups = prompt_groups([int(i) for i in order], b, s.rows_per_point)
            self.points.append((b, [([sweep["agreement"][i] for i in g], [sweep["prompt_lens"][i] for i in g],
                                     [s.max_tokens] * b) for g in groups]))
        if rollout is not None:
            lengths = rollout_lengths(s.rollout_requests, s.rollout_median_tokens, s.rollout_max_tokens, seed=s.seed)
            k = len(rollout["agreement"])
            self.points.append(("rollout", [([rollout["agreement"][i % k] for i in range(len(lengths))],
                                             [rollout["prompt_lens"][i % k] for i in range(len(lengths))],
                                             lengths)]))


def run(make_ctl, workload, profile, repeats=3):
    """{point: [[ms per unit] per repeat]} with one controller from make_ctl throughout."""
    ctl = make_ctl()
    out = {p: [] for p, _ in workload.points}
    rid = 0
    for _ in range(repeats):
        for p, units in workload.points:
            times = []
            for agreement, lens, budgets in units:
                ids = list(range(rid, rid + len(agreement)))
                rid += len(agreement)
                times.append(run_unit(ctl, agreement, lens, ids, budgets, profile))
            out[p].append(times)
    return out


def speedups(make_ctl, workloads, profile, repeats=3):
    """{point: [K=0 time / rule time over repeats 2.. of each workload]}."""
    res = collections.defaultdict(list)
    for w in workloads:
        base = run(lambda: static_controller(0), w, profile, repeats=1)
        out = run(make_ctl, w, profile, repeats)
        for p in out:
            res[p].append(np.sum(base[p][-1]) * (repeats - 1) / np.sum(out[p][1:]))
    return dict(res)


def summary(res) -> str:
    return "  ".join(f"{p}: {np.exp(np.mean(np.log(v))):.3f} [{min(v):.2f},{max(v):.2f}]" for p, v in res.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("rollout")
    ap.add_argument("profile")
    ap.add_argument("--seeds", type=int, default=0, help="also this many random prompt orders")
    args = ap.parse_args()
    sweep, rollout = (json.load(open(f)) for f in (args.sweep, args.rollout))
    profile = Profile.load(args.profile)
    workloads = [Workload(sweep, rollout)] + [Workload(sweep, rollout, seed=s) for s in range(args.seeds)]
    for k in range(0, 7):
        print(f"static-{k:<3d}", summary(speedups(lambda k=k: static_controller(k), workloads, profile)))
    print(f"{'dynamic':10s}", summary(speedups(lambda: make_dynamic(profile), workloads, profile)))
    print(f"{'oracle':10s}", summary(oracle(workloads, profile)))


def oracle(workloads, profile):
    """{point: [K=0 time / the time with the best static K of each unit, known in advance]}."""
    res = collections.defaultdict(list)
    for w in workloads:
        runs = [run(lambda k=k: static_controller(k), w, profile, repeats=1) for k in range(0, 7)]
        for p in runs[0]:
            best = np.min([r[p][-1] for r in runs], axis=0)
            res[p].append(np.sum(runs[0][p][-1]) / np.sum(best))
    return dict(res)


if __name__ == "__main__":
    main()
