"""Engine statistics: throughput, TPOT, acceptance per position, K and batch histograms,
and a per-step trace of the last `TRACE_LIMIT` steps that can be saved as JSON."""

from __future__ import annotations

import collections
import json
import os
import time
import warnings
from typing import Callable

import numpy as np


# Steps the trace keeps (the newest; about 0.5 KB each): an RL loop runs millions of steps
# between resets, and an unbounded trace grew by ~0.5 KB every round.
TRACE_LIMIT = 100_000


class EngineStats:
    """Counts over the engine's runs since the last `reset()`.

    A step is one round (a dispatch runs several): `steps`, `k_hist` and `batch_hist`
    count rounds. `tokens` counts emitted tokens, so a stop token that
    `include_stop_token=False` drops from the output is still counted (it was decoded
    and verified like any other). `reset()` does not touch the controller, whose counts
    `SpecEngine.metrics()` also reports (`SpecEngine.reset_metrics()` resets both).

    `compile_clock()` (optional) returns the seconds the engine has spent compiling so far
    (`Programs.compile_s`): what the runs spent compiling programs on first use (an engine
    not warmed up) is counted as `compile_s` and left out of `tokens_per_s`.

    `controller_s`: host seconds in the K controller, choosing K (through the dispatch
    policy; under several processes with their agreement on it) and observing rounds. On a
    device it overlaps the dispatch in flight; where host and XLA share the CPU cores it
    does not (dynamic's ~0.35 ms a round at B=2 against static K's ~0.06: 2.5-3% of a
    12 ms round, `benchmarks/results/b2_dynamic/`).
    """

    def __init__(self, max_k: int, compile_clock: Callable[[], float] | None = None):
        self.max_k = max_k
        self._compile_clock = compile_clock or (lambda: 0.0)
        self.reset()

    def reset(self) -> None:
        # mid-run (between a stream's tokens) the clocks restart now, so the run goes on
        running = getattr(self, "_run_start", None) is not None
        self.steps = 0
        self.tokens = 0
        self.wall_s = 0.0
        self.compile_s = 0.0  # of wall_s: compiling programs on their first use
        self.controller_s = 0.0  # of wall_s: host time in the K controller
        self.k_hist: collections.Counter = collections.Counter()
        self.batch_hist: collections.Counter = collections.Counter()
        self.accepted_per_pos = np.zeros(max(self.max_k, 1), np.int64)
        self.proposed_per_pos = np.zeros(max(self.max_k, 1), np.int64)
        self.row_steps = 0  # sum over steps of live rows
        self.prefill_tokens = 0  # prompt tokens the prefill programs wrote
        self.shared_prefix_tokens = 0  # prompt positions copied from another's slot instead
        self.tpot_s: list[float] = []
        self.trace: collections.deque[dict] = collections.deque(maxlen=TRACE_LIMIT)  # the newest steps
        self._run_start = time.perf_counter() if running else None
        self._compile_start = self._compile_clock() if running else None
        self.last_step_time = self._run_start

    def begin_run(self) -> None:
        self._run_start = time.perf_counter()
        self._compile_start = self._compile_clock()
        self.last_step_time = self._run_start

    def add_controller_time(self, since: float) -> None:
        """Counts the host time from `since` (a `time.perf_counter()`) to now as the controller's."""
        self.controller_s += time.perf_counter() - since

    def record_step(self, k: int, batch_size: int, num_accepted: np.ndarray, emitted: int,
                    now: float, shard_rows: list[int] | None = None, after_prefill: bool = False,
                    bucket: int | None = None, context: int | None = None, compiled: bool = False) -> float:
        """Records one processed step; returns the wall time since the previous one.
        shard_rows: live rows per data shard (traced under data parallelism). after_prefill:
        the step's dispatch ran right after a prefill, whose time its wall time includes;
        compiled: a program was compiled (its first use) within that time.
        bucket, context: the batch bucket (per data shard) and context length the step's
        program ran at (traced when given; rows that finished still fill the bucket)."""
        dt = now - self.last_step_time
        self.last_step_time = now
        live = len(num_accepted)
        self.steps += 1
        self.tokens += emitted
        self.row_steps += live
        self.k_hist[k] += 1
        self.batch_hist[live] += 1
        if k > 0:
            positions = np.arange(k)
            self.proposed_per_pos[:k] += live
            self.accepted_per_pos[:k] += (num_accepted[:, None] > positions).sum(0)
        self.trace.append({"step": self.steps, "k": k, "batch_size": live, "emitted": emitted,
                           "mean_accepted": float(np.mean(num_accepted)) if live else 0.0,
                           "wall_ms": dt * 1e3, "after_prefill": bool(after_prefill),
                           "compiled": bool(compiled)})
        if shard_rows is not None:
            self.trace[-1]["shard_rows"] = shard_rows
        if bucket is not None:
            self.trace[-1]["bucket"] = int(bucket)
        if context is not None:
            self.trace[-1]["context"] = int(context)
        return dt

    def end_run(self, requests) -> None:
        if self._run_start is not None:
            self.wall_s += time.perf_counter() - self._run_start
            self.compile_s += self._compile_clock() - self._compile_start
            self._run_start = self._compile_start = None
        for r in requests:
            if r.first_token_time and r.finish_time and len(r.tokens) > 1:
                self.tpot_s.append((r.finish_time - r.first_token_time) / (len(r.tokens) - 1))

    def acceptance_per_position(self) -> list[float]:
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = self.accepted_per_pos / self.proposed_per_pos
        return [float(x) if np.isfinite(x) else None for x in rate]

    def to_dict(self, controller_stats: dict | None = None) -> dict:
        decoding_s = self.wall_s - self.compile_s  # a compile's seconds are no decoding speed
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            # of wall_s, compiling programs on their first use (0 after `warmup()`)
            "compile_s": self.compile_s,
            "tokens_per_s": self.tokens / decoding_s if decoding_s > 0 else None,
            "tpot_ms": float(np.median(self.tpot_s) * 1e3) if self.tpot_s else None,
            # host time in the K controller, in all and a round
            "controller_s": self.controller_s,
            "controller_ms_per_step": self.controller_s * 1e3 / self.steps if self.steps else None,
            # tokens committed per live row per step (1 for plain decoding)
            "mean_accepted_len": self.tokens / self.row_steps if self.row_steps else None,
            "acceptance_per_position": self.acceptance_per_position(),
            "k_hist": {int(k): v for k, v in sorted(self.k_hist.items())},
            "batch_hist": {int(b): v for b, v in sorted(self.batch_hist.items())},
            # prompt tokens prefilled, and positions a prompt took from another's prefill
            # instead (SpecEngine(share_prefixes=True); a group's siblings are not counted)
            "prefill_tokens": self.prefill_tokens,
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "controller": controller_stats,
        }

    def save_trace(self, path: str | os.PathLike) -> None:
        """Writes the per-step trace as JSON (atomically: a failed write keeps an old file).
        It holds the newest `TRACE_LIMIT` steps; when more ran, a warning says how many are
        not in the file (each entry's "step" says where it starts)."""
        from dsd_jax.loading import atomic_write
        dropped = self.steps - len(self.trace)
        if dropped > 0:
            warnings.warn(f"the trace keeps the newest {TRACE_LIMIT} steps: the {dropped} steps before "
                          f"them are not in {os.fspath(path)}", stacklevel=2)
        atomic_write(path, lambda f: json.dump(list(self.trace), f))
