"""The replay's controller variants against a profile's error: K chosen from one profile,
every step priced (and observed) at a bench's measured step times (`profile_error.py`).

    PYTHONPATH=. python variants.py margin BENCH.json PROFILE.json sweep.json rollout.json
    PYTHONPATH=. python variants.py learning BENCH.json PROFILE.json sweep.json rollout.json

margin: hysteresis margins 0.03, 0.06, 0.10. learning: latency learnt online
(`latency_forgetting`) with and without exploring, with and without 10% lognormal noise
on the observed step times. Seven prompt orders (the bench's and six random ones).
"""
import json
import sys

import numpy as np

import profile_error
import sim
from dsd_jax.profile import Profile


def noisy(ctl, sigma, rng):
    """`ctl` observing each step time times a lognormal factor (sigma 0: unchanged)."""
    if sigma:
        observe = ctl.observe

        def noisy_observe(k, acc, step_time_s=None, **kw):
            if step_time_s is not None:
                step_time_s *= float(np.exp(rng.normal(0.0, sigma)))
            return observe(k, acc, step_time_s=step_time_s, **kw)

        ctl.observe = noisy_observe
    return ctl


def main(which, bench_path, profile_path, sweep_path, rollout_path):
    profile = Profile.load(profile_path)
    truth, _ = profile_error.measured_profile(json.load(open(bench_path))["rows"], profile)
    sweep, rollout = (json.load(open(p)) for p in (sweep_path, rollout_path))
    ws = [sim.Workload(sweep, rollout)] + [sim.Workload(sweep, rollout, seed=s) for s in range(6)]
    rng = np.random.default_rng(0)
    if which == "margin":
        # recorded before latency learning was on by default: the defaults of then
        cases = {f"margin {m}": dict(margin=m, latency_forgetting=0.0) for m in (0.03, 0.06, 0.1)}
    else:
        cases = {"no learning": dict(latency_forgetting=0.0)}
        for lf, gap, sigma in ((0.05, 0.3, 0), (0.05, 0.3, 0.1), (0.02, 0.3, 0.1), (0.05, 0.0, 0), (0.05, 0.0, 0.1)):
            cases[f"forgetting {lf} explore_gap {gap} noise {sigma}"] = dict(latency_forgetting=lf, explore_gap=gap,
                                                                            _noise=sigma)
    for name, kw in cases.items():
        sigma = kw.pop("_noise", 0)
        make = lambda kw=kw, sigma=sigma: noisy(sim.make_dynamic(profile, **kw), sigma, rng)  # noqa: E731
        print(f"{name:45s}", sim.summary(sim.speedups(make, ws, truth)), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
