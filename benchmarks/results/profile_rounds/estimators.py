"""Which profile-cell estimator prices K best? Reads raw.npz (raw.py) and the engine's
measured step times (rounds.log's two tables, re-typed below from that run), and for
each estimator and profile budget reports, over the ways raw.npz can be split into
independent profiles of that budget:
  - spread: the standard deviation between profiles of log(ITL(K) / ITL(0)) per cell;
  - bias: the mean of log(profiled K/K0 / measured K/K0) per bucket;
  - loss: the goodput the argmax K of each profile gives up against the best K, both
    priced at the measured step times (8-round dispatches at K > 0, 32 at K = 0, as
    dynamic runs them) with s15's profiled acceptance.

    python estimators.py raw.npz > estimators.log
"""
import itertools
import sys

import numpy as np

from dsd_jax.acceptance import al_curve
from dsd_jax.profiler import paired_cells

ACCEPT = [0.81, 0.66, 0.54, 0.46, 0.40, 0.36]  # bench_full_s15.profile.json
# rounds.log: measured ms a step, 32-round dispatches (K = 0 column used) and 8-round (K > 0)
M32 = np.array([[2.9, 4.46, 5.06, 5.66, 5.72, 6.1, 6.55], [3.77, 4.96, 6.01, 6.82, 7.38, 8.25, 9.],
                [4.59, 6.19, 7.9, 9.31, 9.95, 11.52, 12.83], [6.05, 9.02, 11.48, 13.48, 14.65, 17.09, 21.12]])
M8 = np.array([[3.04, 4.63, 5.16, 5.5, 5.82, 6.1, 6.72], [3.84, 4.99, 6.02, 6.64, 7.34, 8.18, 8.96],
               [4.56, 6.27, 7.95, 9.14, 9.94, 11.18, 12.56], [5.81, 8.75, 11.39, 13.2, 14.53, 16.57, 20.44]])
TRUE = np.concatenate([M32[:, :1], M8[:, 1:]], axis=1)
AL = al_curve(np.array(ACCEPT), len(ACCEPT))  # a_i = P(n >= i): AL(K) = 1 + sum_{i<=K} a_i


def median_cells(t):  # t[rep, K] -> cells
    return np.median(t, axis=0)




def main(path):
    raw = np.load(path)
    times = raw["times"]  # [pass, bucket, rep, K, R]
    passes = times.shape[0]
    best = np.argmax(AL / TRUE, axis=1)
    print("AL(K):", np.round(AL, 3))
    print("best K at the measured step times, buckets 1, 2, 4, 8:", best.tolist())
    print(f"{'estimator':<28} {'passes':>6}  {'spread of log K/K0 (mean over K>0) per bucket':<44} "
          f"{'bias per bucket':<28} {'loss per bucket (mean over splits)'}")
    for ri, r in enumerate(raw["rounds"]):
        for name, fn in (("median", median_cells), ("ratio", paired_cells)):
            for n in (1, 2, 3):
                groups = [g for g in itertools.combinations(range(passes), n)]
                # disjoint profiles for the spread; every group for bias and loss
                tabs = np.array([[fn(times[list(g), bi, :, :, ri].reshape(-1, times.shape[3]))
                                  for bi in range(times.shape[1])] for g in groups])
                logr = np.log(tabs / tabs[..., :1])  # [group, bucket, K]
                disjoint = [i for i, g in enumerate(groups) if g[0] % n == 0 and list(g) == list(range(g[0], g[0] + n))]
                spread = logr[disjoint].std(axis=0, ddof=1)[:, 1:].mean(axis=1)
                bias = (logr - np.log(TRUE / TRUE[:, :1])).mean(axis=0)[:, 1:].mean(axis=1)
                choice = np.argmax(AL / tabs, axis=2)  # [group, bucket]
                g_true = AL / TRUE
                loss = 1 - (g_true[np.arange(4), choice] / g_true.max(axis=1)).mean(axis=0)
                print(f"{name + ' R=' + str(r):<28} {n:>6}  {np.round(spread, 3)!s:<44} "
                      f"{np.round(bias, 3)!s:<28} {np.round(loss, 3)}")


if __name__ == "__main__":
    main(sys.argv[1])
