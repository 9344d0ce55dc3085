"""`run_bench`: compile, profile, warm up, run the workloads interleaved, and make the rows."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Sequence

from dsd_jax.bench import profiles
from dsd_jax.bench.pairs import add_intervals
from dsd_jax.bench.runner import Runner, add_speedups, point_row, run_interleaved
from dsd_jax.bench.settings import Settings, has_dynamic, methods_of, resolve
from dsd_jax.bench.workloads import check_distinct_groups, rollout, rollout_meta, sweep, warmup_requests
from dsd_jax.divergence import top2_gap_at
from dsd_jax.loading import encode_prompts


def run_bench(target, draft, tokenizer, prompts, *, batch_sizes=None, configs=None, repeats=None,
              max_tokens=None, profile=None, quick: bool = False, prompt_len: int | None = None,
              rows_per_point: int | None = None, min_units: int | None = None,
              rollout_requests: int | None = None,
              rollout_prompt_len: int | None = None, rollout_median_tokens: int | None = None,
              rollout_max_tokens: int | None = None, rollout_units: int | None = None,
              max_seq_len: int | None = None, max_k: int | None = None, batch_buckets: Sequence[int] | None = None,
              prefill_chunk: int | None = None,
              profile_prompts=None, profile_out: str | os.PathLike | None = None,
              workloads: Sequence[str] = ("sweep", "rollout"), seed: int = 0,
              compilation_cache_dir: str | None = None, runner_hook: Callable | None = None,
              mesh=None, eagle3=None, eagle3_profile=None, eagle3_profile_out: str | os.PathLike | None = None,
              eagle3_max_batch: int | None = None, eagle3_max_k: int | None = None,
              log: Callable[[str], None] | None = print) -> list[dict]:
    """Runs the benchmark; returns the result rows (see `dsd_jax.bench`).

    target, draft: `dsd_jax.models.Transformer`s (draft sharing the target's vocabulary;
        None when no configuration runs the draft model);
    eagle3: the EAGLE-3 head of the "eagle3-" configurations (an `Eagle3Head`, "builtin" or a
        head directory; None when none runs).
    tokenizer: a `tokenizers.Tokenizer` or None (then prompts must be token ids).
    prompts: held-out prompts (strings or token-id lists); at least max(batch_sizes)
        and rollout_requests x rollout_units of them are used, cycling when there are fewer.
    rollout_units: rollouts of rollout_requests each, with their own prompts and lengths:
        the rollout point's pair units (its interval rests on them; 1: no interval).
    rows_per_point, min_units: a sweep point runs ceil(rows_per_point / B) prompt groups of
        B a repeat, and where each repeat takes groups of its own, more until the point has
        `min_units` pair units, as far as the prompts hold them (`workloads.group_count`).
    configs: names ("vanilla", "static-K", "dynamic", and "eagle3-static-K", "eagle3-dynamic"
        for the head) as a list or a comma-separated string; "vanilla" is always added (the
        speedup baseline and lossless oracle).
    profile: a `Profile`, a path to a profile JSON, or None (profile the shared draft-model
        engine now with `profile_engine`; saved to `profile_out` if given).
    eagle3_profile, eagle3_profile_out: the same for the EAGLE-3 engine (eagle3-dynamic).
    eagle3_max_batch: run the eagle3 configurations only at batch sizes <= this (and in the
        rollout only if it has no more requests); their engine gets only those slots.
    eagle3_max_k: the largest K of eagle3-dynamic (None: max_k).
    quick: defaults from `QUICK` instead of `FULL` for every argument left None.
    runner_hook: called as ``runner_hook(runner)`` once engines are compiled and the
        profile is ready (the demo completes a prompt there).
    mesh: a ("data", "model") `jax.sharding.Mesh` every engine runs on (None: one device).
        Under data parallelism the slots (and batch buckets) are per data shard, so the
        largest batch is rounded up to a multiple of the data axis and the engines' own
        per-shard buckets are used.

    Rows: ``{"workload": "sweep", "batch_size", "config", "tokens_per_s",
    "mean_accepted_len", "k_hist", "lossless", ...}`` and ``{"workload": "rollout",
    "config", "makespan_s", "tokens_per_s", "lossless", ...}``, plus one
    ``{"workload": "meta", ...}`` row with the settings, the profile summary and timings.
    Sweep and rollout rows also carry ``tokens_per_s_pairs`` (one per pair unit) and the
    paired intervals ``vs_vanilla`` and ``vs_best_static`` (``{"ratio", "lo", "hi", "n",
    "ci"}``, see `add_intervals`).
    """
    t_start = time.perf_counter()
    log = log or (lambda s: None)
    loaded = {"draft_model": profiles.load(profile), "eagle3": profiles.load(eagle3_profile)}
    profile = loaded["draft_model"][0]
    given = dict(batch_sizes=batch_sizes, configs=configs, repeats=repeats, max_tokens=max_tokens,
                 prompt_len=prompt_len, rows_per_point=rows_per_point, min_units=min_units,
                 rollout_requests=rollout_requests,
                 rollout_prompt_len=rollout_prompt_len, rollout_median_tokens=rollout_median_tokens,
                 rollout_max_tokens=rollout_max_tokens, rollout_units=rollout_units, max_seq_len=max_seq_len,
                 max_k=max_k,
                 batch_buckets=batch_buckets, prefill_chunk=prefill_chunk, workloads=workloads, seed=seed,
                 eagle3_max_batch=eagle3_max_batch, eagle3_max_k=eagle3_max_k)
    s = resolve(quick, given, profile.max_seq_len if profile else None)
    data = 1 if mesh is None else dict(mesh.shape).get("data", 1)
    round_up = lambda n: -(-n // data) * data  # noqa: E731  (slots split evenly over data shards)
    buckets = s.batch_buckets if data == 1 else None
    ids = encode_prompts(prompts, tokenizer, target.config.vocab_size)
    if "sweep" in s.workloads:
        check_distinct_groups(s.batch_sizes, s.rows_per_point, len(ids))
    log(_banner(s))
    runner = Runner(target, draft, tokenizer, configs=s.configs, max_batch_size=round_up(s.max_batch),
                    max_seq_len=s.max_seq_len, max_k={m: s.method_max_k(m) for m in methods_of(s.configs)},
                    batch_buckets=buckets,
                    prefill_chunk=s.prefill_chunk, compilation_cache_dir=compilation_cache_dir, log=log,
                    mesh=mesh, eagle3=_head(eagle3, s.configs),
                    method_max_batch={m: round_up(s.method_max_batch(m)) for m in methods_of(s.configs)})
    seconds: dict[str, float] = {}
    log(f"compiling every (K, batch bucket) program (max_seq_len {s.max_seq_len}) ...")
    with _timer(seconds, "compile"):
        n_programs = runner.warmup()
    outs = {"draft_model": profile_out, "eagle3": eagle3_profile_out}
    prof_info = {m: profiles.prepare(runner, s, *loaded[m], ids=ids, given_prompts=profile_prompts,
                                     tokenizer=tokenizer, vocab=target.config.vocab_size, profile_out=outs[m],
                                     log=log, method=m)
                 for m in methods_of(s.configs) if has_dynamic(s.configs, m)}
    seconds["profile"] = sum(p["seconds"] for p in prof_info.values())
    if runner_hook is not None:
        runner_hook(runner)
    with _timer(seconds, "warmup_runs"):
        for c in s.configs:
            runner.run(c, *warmup_requests(s, ids, runner.engine_for(c).max_batch_size))
    points, lengths = _points(s, ids)
    with _timer(seconds, "timed"):
        run_interleaved(points, lambda c, p, u: runner.run(c, p.units[u], p.sampling_of(u)), s.repeats,
                        on_repeat=lambda rep, p: log(_progress(rep, p, s)))
    rows = add_intervals([point_row(p, c, runner.profile_for(c)) for p in points for c in p.configs])
    add_speedups(rows)
    bad = [(r["workload"], r.get("batch_size"), r["config"]) for r in rows if not r["lossless"]]
    if bad:
        log(f"WARNING: outputs differ from vanilla's (greedy) for {bad}: NOT lossless")
        diagnose(rows, points, target, log)
    seconds["total"] = time.perf_counter() - t_start
    rows.append(_meta(s, runner, lengths, prof_info, n_programs, seconds, lossless=not bad))
    return rows


# Divergences diagnosed per row: each compiles a forward of its own length (about a second here)
DIAGNOSED_PER_ROW = 8


def diagnose(rows: list[dict], points, target, log: Callable[[str], None]) -> None:
    """Adds the target's top-2 logit gap at each row's first `DIAGNOSED_PER_ROW` divergences
    from vanilla (`dsd_jax.divergence.top2_gap_at`, after vanilla's tokens) and logs each:
    a near-tie is the two programs' rounding (verify runs K + 1 positions a row, plain
    decoding one), anything wider a wrong token."""
    by_key = {p.key: p for p in points}
    for r in rows:
        point = by_key[(r["workload"], r.get("batch_size"))]
        for d in r["divergences"][:DIAGNOSED_PER_ROW]:
            prompts = [q for u in point.units_of(d["repeat"]) for q in point.units[u]]
            ref = point.cells["vanilla"].outputs[d["repeat"]][d["request"]]
            d.update(top2_gap_at(target, prompts[d["request"]], ref, d["position"]))
            what = "a near-tie (rounding)" if d["near_tie"] else "NOT a near-tie: a wrong token"
            log(f"  {r['workload']} B={r.get('batch_size')} {r['config']}: repeat {d['repeat']} request "
                f"{d['request']} diverges at token {d['position']}, top-2 gap {d['top2_gap']:.3g} "
                f"({d['gap_in_ulps']} ulps at logit {d['top1_logit']:.4g}): {what}")


def _head(eagle3, configs):
    """The EAGLE-3 head the configurations need: `eagle3` as given, loaded when it names one."""
    if eagle3 is None or "eagle3" not in methods_of(configs):
        return None
    if isinstance(eagle3, (str, os.PathLike)):
        from dsd_jax.models import load_eagle3
        return load_eagle3(eagle3)
    return eagle3


@contextlib.contextmanager
def _timer(seconds: dict, key: str):
    t0 = time.perf_counter()
    yield
    seconds[key] = time.perf_counter() - t0


def _banner(s: Settings) -> str:
    return (f"bench ({'quick' if s.quick else 'full'}): configs {', '.join(s.configs)}; batch sizes "
            f"{s.batch_sizes}; {s.repeats} repeat(s); {s.max_tokens} tokens/request (prompts <= {s.prompt_len} "
            "tokens)" + (f"; rollout of {s.rollout_requests} requests" if s.rollout_requests else ""))


def _points(s: Settings, ids) -> tuple[list, list[int]]:
    """The sweep's points, then the rollout's; and the rollout's output lengths."""
    points = sweep(s, ids) if "sweep" in s.workloads else []
    if not s.rollout_requests:
        return points, []
    roll, lengths = rollout(s, ids)
    return points + [roll], lengths


def _progress(rep: int, p, s: Settings) -> str:
    head = f"  [repeat {rep + 1}/{s.repeats}] "
    if p.workload == "rollout":
        return head + f"rollout of {s.rollout_requests} (x{len(p.units)}): " + ", ".join(
            f"{c} {p.cells[c].walls[rep] / len(p.units):.2f} s" for c in p.configs) + " mean makespan"
    return head + f"sweep B={p.batch_size}: " + ", ".join(
        f"{c} {p.cells[c].tokens[rep] / p.cells[c].walls[rep]:.0f}" for c in p.configs) + " tok/s"


def _engines_text(runner: Runner) -> str:
    own = ", ".join(f"{m}: one shared engine compiled for K=0..{e.max_k} with {e.max_batch_size} slots"
                    for m, e in runner.by_method.items())
    return ("vanilla: own engine (method none)" + (f"; {own}" if own else "")
            + "; static-K and dynamic of a method share its engine, controller swapped per run")


def _meta(s: Settings, runner: Runner, lengths, prof_info, n_programs: int, seconds: dict, lossless: bool) -> dict:
    """The meta row: the settings, the profiles, the engines and where the time went."""
    return {"workload": "meta", "quick": s.quick, "configs": s.configs, "batch_sizes": s.batch_sizes,
            "repeats": s.repeats, "max_tokens": s.max_tokens, "prompt_len": s.prompt_len,
            "rows_per_point": s.rows_per_point, "min_units": s.min_units, "max_seq_len": s.max_seq_len, "max_k": runner.max_k,
            "batch_buckets": runner.batch_buckets,
            "rollout": rollout_meta(s, lengths) if s.rollout_requests else None,
            "eagle3_max_batch": s.eagle3_max_batch, "max_k_by_method": runner.max_ks,
            "temperature": 0.0, "lossless": lossless, "profile": prof_info.get("draft_model"),
            "profiles": prof_info, "engines": _engines_text(runner),
            "programs_compiled": n_programs, "seconds": {k: round(v, 2) for k, v in seconds.items()}}
