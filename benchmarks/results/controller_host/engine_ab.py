"""The goodput controller before and after a change, paired in one process on one engine:
each unit runs the old controller, the new one and static K=4 (for scale) in a rotated
order, on the same held-out prompts (all 615 in turn, cut to 128 tokens, 64 greedy tokens each, makespan
objective, bench_full_s28's profile). Reports the speed ratio new / old with its bootstrap
interval, and each controller's host time a round (`EngineStats.controller_s`).

The old controller is loaded from another checkout's modules (the new one is this
checkout's), so make one first:

    git worktree add --detach /tmp/old 856f6f2
    python benchmarks/results/controller_host/engine_ab.py /tmp/old [units_b1] [units_b2] [units_b4] [units_b8]

`spin MS` pairs this checkout's controller with itself plus MS ms of busy host work a round
instead (`SpinningController`): what a round's host time costs the engine here.

    python benchmarks/results/controller_host/engine_ab.py spin 0.3 [units_b1] [units_b2] [units_b4] [units_b8]

`ks` pairs static K=4, 5 and 6 with dynamic and dynamic capped at K=4 (max_k 4):

    python benchmarks/results/controller_host/engine_ab.py ks [units_b1] [units_b2] [units_b4] [units_b8]

`lone` pairs dynamic under the dispatch policy before the lone-row rule (`WithoutLoneRowRule`)
and after it (`DispatchPolicy._holds`, s29):

    python benchmarks/results/controller_host/engine_ab.py lone [units_b1] [units_b2] [units_b4] [units_b8]

`dispatch` pairs static-4 in its usual dispatches with static-4 in one-round dispatches
(`OneRound`), dynamic beside them:

    python benchmarks/results/controller_host/engine_ab.py dispatch [units_b1] [units_b2] [units_b4] [units_b8]

`latency` pairs dynamic with dynamic pricing steps at the profile's ITL as it is
(`latency_forgetting=0`: no latency learning):

    python benchmarks/results/controller_host/engine_ab.py latency [units_b1] [units_b2] [units_b4] [units_b8]

`held` pairs dynamic under the dispatch policy before s30's held rounds
(`HeldWaitsWithSeveralRows`) and after (`dispatch.HELD_ROUNDS`):

    python benchmarks/results/controller_host/engine_ab.py held [units_b1] [units_b2] [units_b4] [units_b8]

`stable` pairs dynamic with dynamic under `HeldIsStable` (an experiment, not shipped):

    python benchmarks/results/controller_host/engine_ab.py stable [units_b1] [units_b2] [units_b4] [units_b8]

`held0` pairs dynamic (since s32 a held K = 0 is stable at once, as a held K > 0 is) with
dynamic under the policy before (`HeldZeroWaits`), plain decoding beside
(`engine_held0_s32.log` ran before the change, with the candidate as "dynamic-held0" and the
policy before as "dynamic"):

    python benchmarks/results/controller_host/engine_ab.py held0 [units_b1] [units_b2] [units_b4] [units_b8] [units_b16]

`lowk` pairs dynamic with the small fixed Ks the profile ranks best at B=4-8: plain decoding
(`vanilla`, K=0 every round), static-1 and static-2:

    python benchmarks/results/controller_host/engine_ab.py lowk [units_b1] [units_b2] [units_b4] [units_b8]
"""

import collections
import importlib
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.dispatch import STABLE_DECISIONS, DispatchPolicy
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile
from dsd_jax.stats import paired_ratio

PROFILE = "benchmarks/results/bench_full_s28.profile.json"
# the host-side modules the controller is built from (all relative imports among them)
MODULES = ("acceptance", "buckets", "calibration", "config", "controller", "latency", "probes", "profile")


def old_controller_module(checkout: str):
    """The other checkout's controller module, imported as package `dsd_jax_old`."""
    root = tempfile.mkdtemp(prefix="dsd_jax_old_")
    pkg = os.path.join(root, "dsd_jax_old")
    os.makedirs(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for name in MODULES:
        shutil.copy(os.path.join(checkout, "dsd_jax", name + ".py"), pkg)
    sys.path.insert(0, root)
    return importlib.import_module("dsd_jax_old.controller"), importlib.import_module("dsd_jax_old.config"), \
        importlib.import_module("dsd_jax_old.profile")


class SpinningController(Controller):
    """The controller with `spin_ms` of busy host work added to each round it observes:
    what that much more host time costs a round of the engine."""

    def __init__(self, *args, spin_ms: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.spin_s = spin_ms / 1e3

    def observe(self, *args, **kwargs):
        end = time.perf_counter() + self.spin_s
        while time.perf_counter() < end:
            pass
        return super().observe(*args, **kwargs)


class WithoutLoneRowRule(DispatchPolicy):
    """The dispatch policy before `DispatchPolicy._holds` (s29, and s30's held rounds): the K a
    goodput controller holds waits for three equal choices and a lone row keeps the length rule."""

    def _holds(self, k):
        return False


class HeldIsStable(DispatchPolicy):
    """An experiment (s29): the K > 0 a goodput controller holds counts as stable at once, at any
    batch size (no wait for three equal choices; the length rule and 8 rounds stay). Since
    s30 the policy it extends does that itself, with 16 rounds (`dispatch.HELD_ROUNDS`):
    `engine_stable.log` ran at s29's commit."""

    def rounds(self, live, k, *args):
        if self._holds(k):
            self._history.extend([k] * (STABLE_DECISIONS - 1))  # `rounds` appends the third
        return super().rounds(live, k, *args)


class HeldWaitsWithSeveralRows(DispatchPolicy):
    """The dispatch policy before s30's held rounds: several live rows at the K > 0 a goodput
    controller holds wait for three equal choices and run ADAPTIVE_ROUNDS at most (a lone
    row keeps the lone-row rule)."""

    def rounds(self, live, k, *args):
        self._lone = len(live) == 1
        return super().rounds(live, k, *args)

    def _holds(self, k):
        return self._lone and super()._holds(k)


class HeldZeroWaits(DispatchPolicy):
    """The dispatch policy before s32: only a held K > 0 is stable at once; a held K = 0 (never
    `settled` under the makespan objective) waits for three equal choices and runs
    ADAPTIVE_ROUNDS."""

    def _holds(self, k):
        return k > 0 and super()._holds(k)


class OneRound(DispatchPolicy):
    """Every dispatch runs one round: what a dispatch costs beside its rounds."""

    def rounds(self, live, k, *args):
        super().rounds(live, k, *args)
        return 1


def controllers(mode: str, arg: str, buckets) -> dict:
    """{name: controller} to pair in `mode` (the module docstring's): static K=4 for scale
    first; in mode "old", another checkout's controller (at path `arg`) and this one's; in
    mode "spin", `arg` ms of busy host time a round. A name in `POLICIES` runs under that
    dispatch policy."""
    spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))
    ctls = {"static-4": Controller(SpecConfig(method="draft_model", num_speculative_tokens=4), None, buckets[-1],
                                   batch_buckets=buckets)}
    if mode == "ks":  # where dynamic's K goes wrong: fixed Ks around its choices, and dynamic capped at 4
        for k in (5, 6):
            ctls[f"static-{k}"] = Controller(SpecConfig(method="draft_model", num_speculative_tokens=k), None, buckets[-1],
                                             batch_buckets=buckets)
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        capped = SpecConfig(method="draft_model", num_speculative_tokens=4, dynamic=DynamicConfig(objective="makespan"))
        ctls["dynamic-max4"] = Controller(capped, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        return ctls
    if mode == "held0":  # dynamic under the policy before s32 and as it is
        ctls["dynamic-s31"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        ctls["vanilla"] = Controller(SpecConfig(method="none"), None, buckets[-1], batch_buckets=buckets)
        return ctls
    if mode == "lowk":  # where B=4-8's best static K is small: dynamic against K = 0, 1, 2
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        ctls["vanilla"] = Controller(SpecConfig(method="none"), None, buckets[-1], batch_buckets=buckets)
        for k in (1, 2):
            ctls[f"static-{k}"] = Controller(SpecConfig(method="draft_model", num_speculative_tokens=k), None, buckets[-1],
                                             batch_buckets=buckets)
        return ctls
    if mode == "dispatch":  # static-4 in its usual dispatches (1, 32, ...) and in one-round ones
        ctls["static-4-1round"] = Controller(SpecConfig(method="draft_model", num_speculative_tokens=4), None, buckets[-1],
                                             batch_buckets=buckets)
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        return ctls
    if mode == "stable":  # dynamic as shipped and under `HeldIsStable`
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        ctls["dynamic-held-stable"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        return ctls
    if mode == "held":  # dynamic under the dispatch policy before s30's held rounds and after
        ctls["dynamic-s29"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        return ctls
    if mode == "latency":  # dynamic as shipped and with latency learning off (the profile's ITL as it is)
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        fixed = SpecConfig(method="draft_model", num_speculative_tokens=6,
                           dynamic=DynamicConfig(objective="makespan", latency_forgetting=0.0))
        ctls["dynamic-profile-itl"] = Controller(fixed, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        return ctls
    if mode == "lone":  # dynamic under the dispatch policy before and after the lone-row rule
        ctls["dynamic-before"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        ctls["dynamic"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        return ctls
    if mode == "spin":
        ctls["new"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
        ctls["new+spin"] = SpinningController(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets,
                                              spin_ms=float(arg))
        return ctls
    old_ctl, old_cfg, old_prof = old_controller_module(arg)
    old_spec = old_cfg.SpecConfig(method="draft_model", num_speculative_tokens=6,
                                  dynamic=old_cfg.DynamicConfig(objective="makespan"))
    ctls["old"] = old_ctl.Controller(old_spec, old_prof.Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
    ctls["new"] = Controller(spec, Profile.load(PROFILE), buckets[-1], batch_buckets=buckets)
    return ctls


# dispatches each configuration ran: `DispatchPolicy.rounds` is asked once a dispatch
DISPATCHES: collections.Counter = collections.Counter()
_RUNNING = [None]  # the configuration running now
_policy_rounds = DispatchPolicy.rounds


def _counted_rounds(self, *args, **kwargs):
    DISPATCHES[_RUNNING[0]] += 1
    return _policy_rounds(self, *args, **kwargs)


DispatchPolicy.rounds = _counted_rounds

POLICIES = {"dynamic-s31": HeldZeroWaits, "dynamic-s29": HeldWaitsWithSeveralRows, "dynamic-before": WithoutLoneRowRule, "dynamic-held-stable": HeldIsStable, "static-4-1round": OneRound}  # else DispatchPolicy


def main():
    mode, arg = (sys.argv[1], sys.argv[2] if sys.argv[1] == "spin" else None) if sys.argv[1] in ("spin", "ks", "lone", "stable", "dispatch", "latency", "held", "lowk", "held0") \
        else ("old", sys.argv[1])
    first = 3 if mode == "spin" else 2
    units = {b: int(sys.argv[i]) if len(sys.argv) > i else n
             for i, (b, n) in enumerate(((1, 96), (2, 48), (4, 24), (8, 0), (16, 0)), first)}
    units = {b: n for b, n in units.items() if n > 0}
    target, draft, tok = builtin()
    buckets = [1, 2, 4] + [b for b in (8, 16) if b <= max(units)]  # buckets 8 and 16 only when asked: more to compile
    ctls = controllers(mode, arg, buckets)
    spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))
    engine = SpecEngine(target, draft, spec, max_batch_size=buckets[-1], max_seq_len=448, batch_buckets=buckets,
                        controller=ctls["static-4"], profile=Profile.load(PROFILE))
    engine.warmup()
    ids = [tok.encode(p).ids[:128] for p in heldout_prompts(615)]  # all of them, reused past 615
    sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    names = list(ctls)
    pairs = [(names[2], names[1]), (names[1], "static-4"), (names[2], "static-4")]
    if mode == "ks":
        pairs = [(a, "static-4") for a in names[1:]] + [("dynamic-max4", "dynamic")]
    if mode == "lowk":
        pairs = [("dynamic", ref) for ref in names if ref != "dynamic"]
    if mode == "held0":
        pairs += [("dynamic-s31", "vanilla"), ("dynamic", "vanilla")]
    start = 0
    for b, n in units.items():
        walls = collections.defaultdict(list)
        host = collections.defaultdict(float)
        rounds = collections.Counter()
        hist = collections.defaultdict(collections.Counter)
        DISPATCHES.clear()
        for u in range(n):
            group = [ids[i % len(ids)] for i in range(start + u * b, start + (u + 1) * b)]
            for name in names[u % len(names):] + names[:u % len(names)]:
                engine.controller = ctls[name]
                _RUNNING[0] = name
                engine._policy.__class__ = POLICIES.get(name, DispatchPolicy)
                engine.stats.reset()
                engine.reset_prefix_cache()
                t0 = time.perf_counter()
                engine.generate(group, sampling)
                walls[name].append(time.perf_counter() - t0)
                host[name] += engine.stats.controller_s
                rounds[name] += engine.stats.steps
                hist[name].update(engine.stats.k_hist)
        start += n * b
        print(f"B={b}: {n} units")
        for name in names:
            h = hist[name]
            total = sum(h.values())
            print(f"  {name}: median {b * 64 / np.median(walls[name]):.1f} tok/s, controller "
                  f"{host[name] * 1e3 / rounds[name]:.3f} ms a round over {rounds[name]} rounds, "
                  f"{DISPATCHES[name] / n:.1f} dispatches a unit, K "
                  + " ".join(f"K{k}:{100 * v / total:.0f}%" for k, v in sorted(h.items())))
        for a, ref in pairs:
            r = paired_ratio(walls[ref], walls[a])  # speed a / ref = ref's wall / a's, per unit
            print(f"  {a} / {ref}: {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
