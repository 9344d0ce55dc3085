"""Whether the per-request acceptance estimate is calibrated on dynamic's own B=2 rounds
(s30): before each round is observed, every row's estimate a_1..a_6 is kept with the drafts
the row then accepted. Prints, by the K the round ran:

- each draft position's estimated rate against the measured one, conditional on the row
  having reached it (c_i) and unconditional (a_i); `*`: the row had not proposed that
  position before (its estimate there is the untried-drafts rule's or the shrink target's);
- the tokens a row made against the estimate, and against what K=4 would have made on
  the same rounds (greedy drafts do not depend on K: n accepted of K is min(n, 4) of 4),
  with the round times (two live rows) by K.

Same engine, prompts and profile as `engine_ab.py`; dynamic alone (`b2_acceptance.run_b2`).

    python benchmarks/results/controller_host/b2_calibration.py [units] > b2_calibration.log
"""

import collections
import sys

import numpy as np

from b2_acceptance import run_b2
from dsd_jax.controller import Controller


class Logged(Controller):
    """Keeps every observed round with K > 0: (K, drafts accepted per row, the rows'
    estimates a_1..a_max before it, positions each row had proposed, step time)."""

    rounds: list = []

    def observe(self, k, num_accepted, step_time_s=None, request_ids=None, **kwargs):
        kept = None
        if k > 0 and request_ids is not None:
            rq = self._requests
            rows = rq.rows_for(request_ids)
            kept = (k, np.asarray(num_accepted).copy(), np.array(rq.estimate(rows, self._kc)),
                    (rq.proposed[rows] > 0).sum(axis=1), step_time_s)
        super().observe(k, num_accepted, step_time_s=step_time_s, request_ids=request_ids, **kwargs)
        if kept is not None:
            self.rounds.append(kept)


def calibration(rounds) -> None:
    cond = collections.defaultdict(lambda: np.zeros(3))  # (K, i, untried) -> rows, sum estimate, sum accepted
    uncond = collections.defaultdict(lambda: np.zeros(3))
    for k, acc, est, tried, _ in rounds:
        for a, n, t in zip(est, acc, tried):
            c = a / np.concatenate([[1.0], a[:-1]])
            for i in range(1, k + 1):
                key = (k, i, t < i)
                uncond[key] += (1, a[i - 1], n >= i)
                if n >= i - 1:
                    cond[key] += (1, c[i - 1], n >= i)
    for title, cells, name in (("conditional c_i (rows that reached draft i)", cond, "c"),
                               ("unconditional a_i", uncond, "a")):
        print(f"{title}: estimated/measured (rows); * = untried by the row before")
        for k in sorted({key[0] for key in cells}):
            parts = [f"{name}{i}{'*' * untried} {s / n:.3f}/{h / n:.3f} ({n:.0f})"
                     for i in range(1, k + 1) for untried in (False, True)
                     for n, s, h in [cells.get((k, i, untried), np.zeros(3))] if n >= 20]
            print(f"  K={k}: " + "  ".join(parts))


def against_k4(rounds) -> None:
    by_k = collections.defaultdict(lambda: collections.defaultdict(list))
    for k, acc, est, _, t in rounds:
        row = by_k[k]
        row["tokens"].append(1 + acc.mean())
        row["estimate"].append(1 + est[:, :k].sum(axis=1).mean())
        row["as_k4"].append(1 + np.minimum(acc, 4).mean())
        row["estimate_k4"].append(1 + est[:, :4].sum(axis=1).mean())
        if t is not None and len(acc) == 2:
            row["ms"].append(t * 1e3)
    k4_ms = np.median(by_k[4]["ms"])
    print("tokens a row: measured (estimated); K=4 on the same rounds; round ms (two rows, median)")
    for k in sorted(by_k):
        row = {name: np.mean(v) for name, v in by_k[k].items() if name != "ms"}
        ms = np.median(by_k[k]["ms"]) if by_k[k]["ms"] else np.nan
        line = (f"  K={k}: {len(by_k[k]['tokens'])} rounds, {row['tokens']:.3f} ({row['estimate']:.3f}); "
                f"as K=4 {row['as_k4']:.3f} ({row['estimate_k4']:.3f}); {ms:.2f} ms")
        if k > 4:
            line += f"; x{row['tokens'] / row['as_k4']:.3f} the tokens of K=4 for x{ms / k4_ms:.3f} the time"
        print(line)


def main():
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 96
    ctl = run_b2(Logged, units)
    print(f"dynamic at B=2, {units} calls of 2 prompts, {len(ctl.rounds)} rounds with K > 0")
    calibration(ctl.rounds)
    against_k4(ctl.rounds)


if __name__ == "__main__":
    main()
