"""Compiling an engine's programs ahead of use, several at a time (e2e, the profile, the CLI)."""

from __future__ import annotations

import time
from typing import Sequence

from .settings import _expired, _first_line


def precompile(engine, jobs: Sequence[tuple], threads: int = 8, deadline: float | None = None,
               required: int = 1) -> str:
    """Compiles `engine.programs` programs ahead of use, `threads` at a time (XLA compiles
    release the GIL); a job is a method name and its arguments, e.g. ("step", 4, 1). The
    first job compiles first, alone: give one holding both kernels (a K > 0 step), so a
    Pallas fallback happens before the threads start. Jobs are started in order, none after
    `deadline` (a `time.perf_counter()` value) but the first `required` (distinct) ones:
    what the caller will run whatever the time, better compiled side by side than one by one
    at first use. Anything that fails or is left here is left for the first use to compile
    (and report)."""
    from concurrent.futures import ThreadPoolExecutor
    programs = engine.programs
    fallback = programs._fallback
    jobs = list(dict.fromkeys(tuple(j) for j in jobs))
    required_jobs = set(jobs[:max(1, required)])

    def compile_job(job) -> bool:  # at the engine's matmul precision, in any thread (`Programs._get`)
        if job not in required_jobs and _expired(deadline):
            return False
        getattr(programs, job[0])(*job[1:])
        return True

    try:
        t0 = time.perf_counter()
        compile_job(jobs[0])
        t1 = time.perf_counter()
        programs._fallback = False  # no kernel switch while threads compile
        with ThreadPoolExecutor(max(1, threads)) as pool:
            done = 1 + sum(pool.map(compile_job, jobs[1:]))
        left = f" ({len(jobs) - done} left: time budget)" if done < len(jobs) else ""
        # whether threads pay on this host: the first program alone, against the rest's rate
        # (XLA:CPU gained 5% from 2 threads on 2 cores; a GPU compile also autotunes on the device)
        rate = (f"; the first alone {t1 - t0:.1f} s, the other {done - 1} in {time.perf_counter() - t1:.1f} s"
                if done > 1 else "")
        return f"{done} programs, {threads} threads{left}{rate}"
    except Exception as e:  # noqa: BLE001
        return f"incomplete ({_first_line(e)}); the rest compiled one by one"
    finally:
        programs._fallback = fallback


def precompile_steps(engine, ks, buckets, threads: int = 8, deadline: float | None = None) -> str:
    """`precompile` of the (K, B) step programs bucket after bucket in the order given, the
    largest K of the first bucket first. Every K of the first bucket compiles, past the
    deadline too: the profile times that bucket whatever the time (its first row), and
    compiled at first use its Ks compiled one by one (on the CPU a cut profile of a tiny pair
    spent 19 s of its 29 s so)."""
    ks, buckets = list(ks), list(buckets)
    return precompile(engine, [("step", ks[-1], buckets[0])]
                      + [("step", k, b) for b in buckets for k in ks], threads, deadline, required=len(ks))
