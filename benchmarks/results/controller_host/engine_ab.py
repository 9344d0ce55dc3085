"""The goodput controller before and after a change, paired in one process on one engine:
each unit runs the old controller, the new one and static K=4 (for scale) in a rotated
order, on the same held-out prompts (cut to 128 tokens, 64 greedy tokens each, makespan
objective, bench_full_s28's profile). Reports the speed ratio new / old with its bootstrap
interval, and each controller's host time a round (`EngineStats.controller_s`).

The old controller is loaded from another checkout's modules (the new one is this
checkout's), so make one first:

    git worktree add --detach /tmp/old 856f6f2
    python benchmarks/results/controller_host/engine_ab.py /tmp/old [units_b1] [units_b2] [units_b4]
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


def main():
    checkout = sys.argv[1]
    units = {b: int(sys.argv[i]) if len(sys.argv) > i else n for i, (b, n) in enumerate(((1, 96), (2, 48), (4, 24)), 2)}
    old_ctl, old_cfg, old_prof = old_controller_module(checkout)
    target, draft, tok = builtin()
    buckets = [1, 2, 4]
    spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))
    old_spec = old_cfg.SpecConfig(method="draft_model", num_speculative_tokens=6,
                                  dynamic=old_cfg.DynamicConfig(objective="makespan"))
    ctls = {"static-4": Controller(SpecConfig(method="draft_model", num_speculative_tokens=4), None, 4,
                                   batch_buckets=buckets),
            "old": old_ctl.Controller(old_spec, old_prof.Profile.load(PROFILE), 4, batch_buckets=buckets),
            "new": Controller(spec, Profile.load(PROFILE), 4, batch_buckets=buckets)}
    engine = SpecEngine(target, draft, spec, max_batch_size=4, max_seq_len=448, batch_buckets=buckets,
                        controller=ctls["static-4"], profile=Profile.load(PROFILE))
    engine.warmup()
    ids = [tok.encode(p).ids[:128] for p in heldout_prompts(sum(b * n for b, n in units.items()))]
    sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    names = list(ctls)
    start = 0
    for b, n in units.items():
        walls = collections.defaultdict(list)
        host = collections.defaultdict(float)
        rounds = collections.Counter()
        hist = collections.defaultdict(collections.Counter)
        for u in range(n):
            group = ids[start + u * b:start + (u + 1) * b]
            for name in names[u % len(names):] + names[:u % len(names)]:
                engine.controller = ctls[name]
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
                  f"{host[name] * 1e3 / rounds[name]:.3f} ms a round over {rounds[name]} rounds, K "
                  + " ".join(f"K{k}:{100 * v / total:.0f}%" for k, v in sorted(h.items())))
        for a, ref in (("new", "old"), ("old", "static-4"), ("new", "static-4")):
            r = paired_ratio(walls[ref], walls[a])  # speed a / ref = ref's wall / a's, per unit
            print(f"  {a} / {ref}: {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
