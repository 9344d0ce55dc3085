"""Paired, interleaved timing shared by the scripts in this folder.

`interleave(fns, inputs, reps)`: every configuration runs every input once per repeat, in
an order rotated by (repeat + input) so drift hits all alike; one untimed warm-up pass
first; each unit's outputs must agree across configurations. `speed(base, other)`: the
median of other's speed over base's per unit, with a 95% bootstrap interval.
"""
import statistics
import time

import numpy as np


def interleave(fns: dict, inputs: list, reps: int) -> dict:
    for x in inputs:
        for f in fns.values():
            f(x)
    names, t = list(fns), {k: [] for k in fns}
    for rep in range(reps):
        for i, x in enumerate(inputs):
            shift = (rep + i) % len(names)
            outs = []
            for k in names[shift:] + names[:shift]:
                t0 = time.perf_counter()
                outs.append(fns[k](x))
                t[k].append(time.perf_counter() - t0)
            assert all(o == outs[0] for o in outs), "configurations disagree on an output"
    return t


def speed(base: list, other: list, n: int = 4000):
    r = np.array(base) / np.array(other)
    rng = np.random.default_rng(0)
    boot = [np.median(r[rng.integers(0, len(r), len(r))]) for _ in range(n)]
    return round(float(np.median(r)), 4), np.percentile(boot, [2.5, 97.5]).round(4).tolist()


def medians_ms(t: dict) -> dict:
    return {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()}


def plain_engine(cls, target, tokenizer, max_seq_len: int):
    """A warmed-up one-slot plain-decoding engine of class `cls` (SpecEngine or a subclass)."""
    from dsd_jax.config import SpecConfig

    e = cls(target, None, SpecConfig(method="none"), max_batch_size=1, max_seq_len=max_seq_len,
            tokenizer=tokenizer, batch_buckets=[1])
    e.warmup()
    return e


def report(t: dict, label: str, ratios: list) -> None:
    """Prints the medians and, for each (name, other, base), other's speed over base's."""
    print(f"{label}, {len(next(iter(t.values())))} paired calls; medians ms", medians_ms(t))
    for name, other, base in ratios:
        print(name, speed(t[base], t[other]))
