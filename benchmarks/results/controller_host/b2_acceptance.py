"""Whether dynamic's K=5-6 rounds at B=2 were worth their price: each such round's measured
tokens against the predicted AL, and against what K=4 would have made on the same round
(greedy drafts do not depend on K, so a round that accepted n drafts of 6 would have
accepted min(n, 4) of 4), beside the measured step times by K. Same engine, prompts
and profile as `engine_ab.py`; dynamic alone.

    python benchmarks/results/controller_host/b2_acceptance.py [units] > b2_acceptance.log
"""

import collections
import sys

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.config import DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile

PROFILE = "benchmarks/results/bench_full_s28.profile.json"


class Logged(Controller):
    """Keeps every observed round: (k, drafts accepted per row, step time)."""

    rounds: list = []

    def observe(self, k, num_accepted, step_time_s=None, **kwargs):
        super().observe(k, num_accepted, step_time_s=step_time_s, **kwargs)
        self.rounds.append((k, np.asarray(num_accepted).copy(), step_time_s))


def run_b2(controller_class, units: int):
    """Dynamic under a `controller_class` (a `Controller` keeping its rounds in `rounds`) on
    `units` calls of two held-out prompts; returns the controller."""
    buckets = [1, 2, 4]
    spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))
    ctl = controller_class(spec, Profile.load(PROFILE), 4, batch_buckets=buckets, history=1 << 20)
    target, draft, tok = builtin()
    engine = SpecEngine(target, draft, spec, max_batch_size=4, max_seq_len=448, batch_buckets=buckets,
                        controller=ctl, profile=Profile.load(PROFILE))
    engine.warmup()
    ctl.rounds.clear()
    ctl._calibration._log.clear()
    ids = [tok.encode(p).ids[:128] for p in heldout_prompts(615)]
    sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    for u in range(units):
        engine.generate(ids[2 * u:2 * u + 2], sampling)
    return ctl


def main():
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 96
    ctl = run_b2(Logged, units)
    log = ctl.calibration_log()[-len(ctl.rounds):]
    by_k = collections.defaultdict(lambda: collections.defaultdict(list))
    for (k, acc, t), rec in zip(ctl.rounds, log):
        assert rec["k"] == k
        row = by_k[k]
        row["tokens"].append(1.0 + acc.mean())
        row["as_k4"].append(1.0 + np.minimum(acc, 4).mean())
        row["pred_al"].append(rec.get("pred_al", np.nan))
        if t is not None and len(acc) == 2:
            row["ms"].append(t * 1e3)
    print(f"dynamic at B=2, {units} calls of 2 prompts; rounds of two live rows timed")
    k4_ms = np.median(by_k[4]["ms"]) if by_k[4]["ms"] else np.nan
    for k in sorted(by_k):
        row = by_k[k]
        ms = np.median(row["ms"]) if row["ms"] else np.nan
        line = (f"  K={k}: {len(row['tokens'])} rounds, tokens a row {np.mean(row['tokens']):.3f} "
                f"(predicted {np.nanmean(row['pred_al']) if k else 1.0:.3f}), round {ms:.2f} ms")
        if k > 4:
            gain = np.mean(row["tokens"]) / np.mean(row["as_k4"])
            line += (f"; K=4 on the same rounds {np.mean(row['as_k4']):.3f} tokens: x{gain:.3f} the tokens"
                     f" for x{ms / k4_ms:.3f} the time")
        print(line)


if __name__ == "__main__":
    main()
