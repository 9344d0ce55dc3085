"""The ``profile`` section: the ITL(B, K) profile of a synthetic pair and the K schedules it implies."""

from __future__ import annotations

import gc
import os
import time
from typing import Sequence

import numpy as np

from .compile import precompile_steps
from .floor import draft_share_point, floor_point, kernel_launches
from .settings import (FLOOR_RESERVE_S, PROFILE_COMPILE_SHARE, PROFILE_RESERVE_S, VLLM_H100_SCHEDULE,
                       Settings, _unless_expired, device_info)


def profile_with_acceptance(engine, acceptance: Sequence[float], **kw):
    """`profiler.profile_engine(engine, **kw)` with the acceptance given, not measured: the
    latency table is measured on this device, a_1..a_max_k are `acceptance` (at least
    max_k values; those past max_k are kept in ``meta["acceptance_given"]``, not used).
    Returns the `Profile`."""
    from dsd_jax.profiler import profile_engine
    acc = [float(a) for a in acceptance]
    if len(acc) < engine.max_k:
        raise ValueError(f"need at least max_k={engine.max_k} acceptance values, got {len(acc)}")
    prof = profile_engine(engine, acceptance=acc[:engine.max_k], **kw)
    prof.meta["acceptance_source"] = "given"
    prof.meta["acceptance_given"] = acc
    return prof


def k_schedule(profile, acceptance: Sequence[float], context_len: float | None = None,
               batch_sizes: Sequence[int] | None = None) -> list[dict]:
    """argmax_K AL(K) / ITL(B, K) per batch size (the goodput rule, no margin), with
    AL(K) = 1 + a_1 + ... + a_K over the profile's Ks."""
    acc = list(acceptance)[:profile.max_k]
    acc += [0.0] * (profile.max_k - len(acc))
    al = np.concatenate([[1.0], 1.0 + np.cumsum(acc)])
    rows = []
    for b in batch_sizes or profile.batch_sizes:
        itl = np.array([profile.itl_ms(b, k, context_len) for k in profile.ks])
        good = al[np.asarray(profile.ks)] / itl
        best = int(profile.ks[int(np.argmax(good))])
        rows.append({"B": int(b), "best_k": best, "itl_ms": itl.round(4).tolist(),
                     "goodput_tok_per_ms_row": good.round(4).tolist(),
                     "speedup_vs_k0": float(good.max() / good[0])})
    return rows


def controller_schedule(profile, context_len: float | None = None) -> list[dict]:
    """The K the engine's goodput controller (`dsd_jax.controller.Controller`, default
    `DynamicConfig`: margin, hysteresis) picks first at each profiled batch size, starting
    from K = 0, with the profile's acceptance as its prior."""
    from dsd_jax.config import DynamicConfig, SpecConfig
    from dsd_jax.controller import Controller
    spec = SpecConfig(num_speculative_tokens=profile.max_k, dynamic=DynamicConfig())
    rows = []
    for b in profile.batch_sizes:
        ctl = Controller(spec, profile, max_batch_size=max(profile.batch_sizes),
                         batch_buckets=profile.batch_sizes)
        rows.append({"B": int(b), "best_k": int(ctl.choose_k(int(b), context_len))})
    return rows


def schedule_ranges(rows: Sequence[dict]) -> list[list[int]]:
    """[[start_bs, end_bs, K], ...] (vLLM's per-batch-size format) from `k_schedule` rows."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][2] == r["best_k"]:
            out[-1][1] = r["B"]
        else:
            out.append([r["B"], r["B"], r["best_k"]])
    return out


def _raw_row(profile, batch: int):
    """The profile's row at `batch` and its shortest context as measured, not made monotone
    in K (`meta["latency_ms_raw"]`; the table pools cells that break the order, and those
    are what the floors are for). None: not profiled."""
    if batch not in profile.batch_sizes:
        return None
    table = profile.meta.get("latency_ms_raw") or profile.latency_ms
    return table[0][profile.batch_sizes.index(batch)]


def _k0_ms(profile, batch: int) -> float | None:
    """The K = 0 step at `batch` and the shortest context, as measured (None: not profiled)."""
    row = _raw_row(profile, batch)
    return None if row is None else float(row[profile.ks.index(0)])


def _draft_token_ms(profile, batch: int) -> float | None:
    """What one more draft token adds to a step at `batch` and the shortest context, as
    measured: the mean of ITL(K+1) - ITL(K) over K >= 1, which is (ITL(max_k) - ITL(1)) /
    (max_k - 1) (K = 0 -> 1 also starts the draft; one more verified token is in each
    difference). None: not profiled, or max_k < 2."""
    row = _raw_row(profile, batch)
    if row is None or profile.max_k < 2:
        return None
    return float(np.mean(np.diff(row[1:])))


def bucket_order(buckets: Sequence[int]) -> list[int]:
    """`Settings.profile_buckets` checked: distinct positive batch sizes, order kept."""
    order = [int(b) for b in buckets]
    if not order or len(set(order)) != len(order) or min(order) < 1:
        raise ValueError(f"profile buckets must be distinct positive batch sizes, got {list(buckets)}")
    return order


def profile_pair(s: Settings, out_dir: str | None = None, deadline: float | None = None) -> dict:
    """The synthetic pair's ITL(B, K) profile and the K schedules it implies. Under a
    `deadline`, the step programs compile in the order of `s.profile_buckets` for at most
    `PROFILE_COMPILE_SHARE` of the time, the compiled buckets are timed until
    `PROFILE_RESERVE_S` before it, and the profile holds those timed (its meta says what
    was cut). Then, in the last `FLOOR_RESERVE_S`, the target's K = 0 step and the draft's
    cost per draft token against their floors at `s.floor_batch_sizes` (`floor.floor_point`),
    with the drafter's share of a step where one was profiled (`floor.draft_share_point`)."""
    import dsd_jax as dsd
    from dsd_jax.models import synthetic
    from dsd_jax.profiler import format_profile
    order = bucket_order(s.profile_buckets)
    t_name, d_name = s.profile_pair
    target = synthetic(t_name, dtype=s.dtype, seed=0)
    draft = synthetic(d_name, dtype=s.dtype, seed=1)
    engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=s.profile_max_k),
                            max_batch_size=max(order),
                            max_seq_len=s.profile_max_seq_len or max(s.profile_contexts) + 64,
                            batch_buckets=tuple(sorted(order)), backend="auto")
    # both models stay for the floors (the engine holds their arrays, not copies)
    t0 = time.perf_counter()
    ks = range(s.profile_max_k + 1)
    timing_end = compile_end = None
    if deadline is not None:
        timing_end = deadline - PROFILE_RESERVE_S - FLOOR_RESERVE_S
        compile_end = t0 + PROFILE_COMPILE_SHARE * max(0.0, timing_end - t0)
    compiled = precompile_steps(engine, ks, order, s.compile_threads, compile_end)
    t_compile = time.perf_counter() - t0
    # only buckets whose programs are all compiled, unless precompiling failed (then the
    # profile compiles each as it reaches it)
    ready = [b for b in order if all(engine.programs.is_compiled("step", k, b) for k in ks)]
    prof = profile_with_acceptance(engine, s.acceptance, context_lengths=s.profile_contexts,
                                   repeats=s.profile_repeats, warmup_reps=s.profile_warmup_reps,
                                   batch_sizes=ready or order, deadline=timing_end)
    prof.meta["synthetic"] = {"target": t_name, "draft": d_name, "dtype": s.dtype}
    uncompiled = sorted(set(order) - set(ready)) if ready else []
    if uncompiled:  # left out before the profile saw them: cut all the same
        cut = prof.meta.setdefault("truncated", {})
        cut["dropped_batch_sizes"] = sorted(set(cut.get("dropped_batch_sizes", [])) | set(uncompiled))
    path = None
    if out_dir:
        path = os.path.join(out_dir, "profile.json")
        prof.save(path)
    bw = device_info().get("hbm_bytes_per_s")
    # by batch size, target then draft: a cut keeps both models at the first sizes
    ctx = prof.context_lengths[0]
    floor = []
    for b in s.floor_batch_sizes:
        floor.append(_unless_expired(deadline, floor_point, target, "target", b, ctx, _k0_ms(prof, b),
                                     s.profile_repeats, bw))
        if b in prof.batch_sizes and "bare_forward_ms" in floor[-1]:  # the K = 0 round's kernels
            floor[-1]["step_kernels"] = kernel_launches(engine.programs.step(0, b).as_text())
        floor.append(_unless_expired(deadline, floor_point, draft, "draft", b, ctx,
                                     _draft_token_ms(prof, b), s.profile_repeats, bw))
        if b in prof.batch_sizes and "bare_forward_ms" in floor[-1]:  # where a step is compiled
            floor[-1]["in_step"] = _unless_expired(deadline, draft_share_point, engine, b, ctx,
                                                   s.profile_repeats)
    schedules = {str(c): k_schedule(prof, s.acceptance, c) for c in prof.context_lengths}
    res = {"pair": f"{t_name} + {d_name} ({s.dtype})", "kernel_backends": engine.kernel_backends,
           "seconds": round(time.perf_counter() - t0, 1), "compile_seconds": round(t_compile, 1),
           "precompiled": compiled, "profile_path": path, "truncated": prof.meta.get("truncated"),
           "batch_sizes": list(prof.batch_sizes), "ks": list(prof.ks),
           "context_lengths": list(prof.context_lengths), "latency_ms": prof.latency_ms,
           "latency_ms_raw": prof.meta.get("latency_ms_raw"), "acceptance": list(prof.acceptance),
           "k_schedule": schedules,
           "k_schedule_ranges": {c: schedule_ranges(r) for c, r in schedules.items()},
           "controller_schedule_ranges": {
               str(c): schedule_ranges(controller_schedule(prof, c)) for c in prof.context_lengths},
           "vllm_h100_schedule": VLLM_H100_SCHEDULE, "table": format_profile(prof), "floor": floor}
    del engine, target, draft
    gc.collect()
    return res
