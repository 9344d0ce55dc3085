"""Records every call a `SpecEngine` makes to its goodput controller, and replays such a
record against the controller of the checked-out code: the same choices, the same
calibration log and the same stats, or the first call that differs. It proves a change
meant to make the controller cheaper leaves every decision as it was.

    python benchmarks/results/controller_host/trace.py record OUT.pkl [units]
    python benchmarks/results/controller_host/trace.py replay OUT.pkl [repeats]

`record` runs the built-in pair with the makespan objective (the default) on bench_full_s28's
profile, buckets 1-8: `units` calls (default 12) of B = 1, 2, 4 and 8 held-out prompts, greedy
then at T=1, 64 tokens each, then a call of 24 prompts at B<=8 (a queue: refilled slots).
`repeats` also times that many more replays (the controller's host time a call, no engine).
"""

import copy
import pickle
import sys
import time

import numpy as np

from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.profile import Profile

PROFILE = "benchmarks/results/bench_full_s28.profile.json"
BUCKETS = [1, 2, 4, 8]
RECORDED = ("choose_k", "observe", "held_k", "settled", "serving_bucket", "forget_request", "end_run",
            "use_temperature", "reset_counts", "stats")


def _frozen(x):
    """A copy of an argument the caller may modify after the call (lists, arrays)."""
    return np.array(x, copy=True) if isinstance(x, np.ndarray) else copy.deepcopy(x)


class RecordingController(Controller):
    """A Controller that appends (method, args, kwargs, result) for each public call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []
        for name in RECORDED:
            setattr(self, name, self._recorded(name, getattr(super(), name)))

    def _recorded(self, name, method):
        def call(*args, **kwargs):
            entry = [name, [_frozen(a) for a in args], {k: _frozen(v) for k, v in kwargs.items()}]
            result = method(*args, **kwargs)
            entry.append(_frozen(result))
            self.calls.append(entry)
            return result
        return call


def spec():
    return SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))


def record(out, units):
    from dsd_jax import SamplingParams, SpecEngine
    from dsd_jax.models import builtin, heldout_prompts

    target, draft, tok = builtin()
    prof = Profile.load(PROFILE)
    ctl = RecordingController(spec(), prof, 8, batch_buckets=BUCKETS)
    engine = SpecEngine(target, draft, spec(), max_batch_size=8, max_seq_len=448, batch_buckets=BUCKETS,
                        controller=ctl, profile=prof)
    engine.warmup()  # its calls are recorded too: the replay starts from a new controller
    ids = [tok.encode(p).ids[:128] for p in heldout_prompts(2 * units * 15 + 24)]
    start = 0
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(temperature=temperature, max_tokens=64, ignore_eos=True)
        for b in (1, 2, 4, 8):
            for _ in range(units):
                engine.generate(ids[start:start + b], sampling)
                start += b
        print(f"T={temperature}: {len(ctl.calls)} calls so far", flush=True)
    engine.generate(ids[start:start + 24], SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    ctl.stats()
    ctl.calls.append(["calibration_log", [], {}, ctl.calibration_log()])
    with open(out, "wb") as f:
        pickle.dump(ctl.calls, f)
    print(f"{len(ctl.calls)} calls recorded; K chosen:", ctl.stats()["k_choices"])


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def replay(path, repeats=0):
    """Replays the record at `path` on a new controller; with `repeats`, that many times more,
    timed, printing each method's host time a call (the median over the repeats)."""
    with open(path, "rb") as f:
        calls = pickle.load(f)
    _replay(calls, check=True)
    print(f"{len(calls)} calls replayed: every result identical")
    if not repeats:
        return
    runs = [_replay(calls, check=False) for _ in range(repeats)]
    counts = {}
    for name, *_ in calls:
        counts[name] = counts.get(name, 0) + 1
    per_call = {name: np.median([r[name] for r in runs]) / counts[name] for name in counts}
    for name in sorted(per_call, key=lambda n: per_call[n] * counts[n], reverse=True):
        print(f"  {name}: {counts[name]} calls, {per_call[name] * 1e6:.1f} us a call")
    total = np.array([sum(r.values()) for r in runs]) / counts["observe"]
    print(f"  all calls: {np.median(total) * 1e6:.1f} us an observed round (median of {repeats}; "
          f"min {total.min() * 1e6:.1f}, max {total.max() * 1e6:.1f})")


def _replay(calls, check):
    """{method: seconds in it} over one replay of `calls` on a new controller; with `check`,
    stops at the first result that differs from the record."""
    ctl = Controller(spec(), Profile.load(PROFILE), 8, batch_buckets=BUCKETS)
    seconds = dict.fromkeys((c[0] for c in calls), 0.0)
    clock = time.perf_counter
    for i, (name, args, kwargs, expected) in enumerate(calls):
        method = getattr(ctl, name)
        t0 = clock()
        got = method(*args, **kwargs)
        seconds[name] += clock() - t0
        if check and not _same(got, expected):
            raise SystemExit(f"call {i} ({name}{tuple(args)} {kwargs}) returned {got!r}, recorded {expected!r}")
    return seconds


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 12)
    else:
        replay(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
