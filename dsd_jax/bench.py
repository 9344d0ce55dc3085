"""`dsd-jax bench` and `dsd-jax demo`: vanilla vs static-K vs dynamic speculative decoding.

One process. Every configuration runs on the same prompts, greedy (temperature 0),
with the same output lengths, so all of them do the same useful work and their
outputs must be token-identical to vanilla's (checked: ``"lossless"`` on every row;
a fast wrong answer is worthless).

Engines: `vanilla` is its own engine (``SpecConfig(method="none")``: target only, no
draft state). Every speculative configuration shares **one** draft-model engine
compiled for K = 0..max_k (6; 3 with --quick); a configuration is the controller
object swapped into ``engine.controller`` before each run:

- ``static-K``: the library's own static controller,
  ``Controller(SpecConfig(method="draft_model", num_speculative_tokens=K))``;
- ``dynamic``: the goodput controller,
  ``Controller(SpecConfig(method="draft_model", num_speculative_tokens=max_k,
  dynamic=DynamicConfig(profile=...)), profile, max_batch_size,
  batch_buckets=engine.batch_buckets)``, with a profile made by
  `dsd_jax.profiler.profile_engine` on this engine (or loaded with ``--profile``);
- ``dynamic-throughput`` (not run by default): the same with
  ``DynamicConfig(objective="throughput")``, vLLM's batch-mean goodput, for a side by
  side comparison with the default makespan objective. The summaries compare
  ``dynamic`` with the best of vanilla and the static Ks only.

The (K, bucket) program a step runs is the same executable whichever controller
chose K, so sharing the engine changes no measured step; it saves compiling the
grid once per configuration. Static controllers are stateless; the dynamic one is
built once and kept for the whole bench, as a serving engine keeps its controller
across calls, so live acceptance learnt in earlier runs corrects the profile's.

Method: every engine is warmed up (`engine.warmup()` compiles every program), then
each configuration does one untimed run whose live batch shrinks through every
bucket. Timed runs are interleaved: for each repeat, for each batch size and each of
its prompt groups, the configurations run in an order rotated by one each time, so
slow drift of the machine (thermal, other processes) spreads over all of them.
Reported numbers are medians over repeats. Every (prompt group, repeat) of the sweep
and every repeat of the rollout is a *pair unit*: all configurations ran it back to
back, so its tokens/s are compared pair by pair (``tokens_per_s_pairs``), and each
configuration's ratio to vanilla and to the best static K carries a paired bootstrap
95% interval (`dsd_jax.stats.paired_ratio`: ``vs_vanilla``, ``vs_best_static``). A
difference is called real only when its interval excludes 1 (``summarize()["differences"]``).

Workloads:

- *sweep*: for each batch size B, B held-out prompts (token ids, truncated to
  ``prompt_len``) generated together with fixed ``max_tokens``; small B runs several
  prompt groups one after another (at least ``rows_per_point`` prompts per point) so
  a single prompt's acceptance does not decide the point. tokens/s = generated tokens
  / wall time of `generate` (prefill included); ``decode_tokens_per_s`` leaves out the
  prefill and the first step (from the engine's per-step trace).
- *rollout*: ``rollout_requests`` requests started together with heavy-tailed output
  lengths (seeded lognormal, capped), so the live batch shrinks to a long tail as in
  an RL rollout; makespan = wall time of the single `generate`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from dsd_jax import stats
from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.profile import Profile
from dsd_jax.sampling import SamplingParams

__all__ = ["run_bench", "main", "demo", "summarize", "format_table", "write_json", "write_plot",
           "parse_config", "environment", "rollout_lengths", "profile_fit_problems", "add_intervals",
           "QUICK", "FULL"]

# Settings of the two modes (every one can be overridden).
FULL = dict(batch_sizes=(1, 2, 4, 8, 16, 32, 64),
            configs=("vanilla", "static-1", "static-2", "static-3", "static-4", "static-6", "dynamic"),
            repeats=3, max_tokens=64, prompt_len=128, rows_per_point=8,
            rollout_requests=64, rollout_prompt_len=64, rollout_median_tokens=32, rollout_max_tokens=320,
            max_seq_len=448, max_k=6, batch_buckets=None, prefill_chunk=None,
            profile_repeats=7, profile_warmup_reps=2, profile_prompts=16, profile_max_tokens=64)
# --quick compiles 4 batch buckets (the sweep's batch sizes) and K <= 3: 38 programs, still
# more than half of the demo's time on 2 slow CPU cores (K <= 4 took the demo to 5 minutes).
QUICK = dict(batch_sizes=(1, 4, 16, 64),
             configs=("vanilla", "static-1", "static-3", "dynamic"),
             repeats=2, max_tokens=24, prompt_len=64, rows_per_point=4,
             rollout_requests=64, rollout_prompt_len=48, rollout_median_tokens=12, rollout_max_tokens=112,
             max_seq_len=160, max_k=3, batch_buckets=(1, 4, 16, 64), prefill_chunk=32,
             profile_repeats=7, profile_warmup_reps=2, profile_prompts=8, profile_max_tokens=48)


# --------------------------------------------------------------------------- configurations

# dynamic configurations -> DynamicConfig.objective
DYNAMIC_OBJECTIVES = {"dynamic": "makespan", "dynamic-throughput": "throughput"}


def parse_config(name: str) -> tuple[str, int | None]:
    """"vanilla" -> ("vanilla", None); "static-3" -> ("static", 3); "dynamic" and
    "dynamic-throughput" -> ("dynamic", None)."""
    if not isinstance(name, str):
        raise ValueError(f"configuration names are strings, got {name!r}")
    if name == "vanilla":
        return name, None
    if name in DYNAMIC_OBJECTIVES:
        return "dynamic", None
    if name.startswith("static-"):
        try:
            k = int(name[len("static-"):])
        except ValueError:
            k = -1
        if k >= 1:
            return "static", k
    raise ValueError(f"unknown configuration {name!r}: use vanilla, static-K (K >= 1), dynamic or dynamic-throughput")


def _config_list(configs) -> list[str]:
    if isinstance(configs, str):
        configs = [c.strip() for c in configs.split(",") if c.strip()]
    configs = list(dict.fromkeys(configs))
    if not configs:
        raise ValueError("no configurations to run")
    for c in configs:
        parse_config(c)
    if "vanilla" not in configs:  # the baseline for speedups and the lossless check
        configs.insert(0, "vanilla")
    return configs


def _has_dynamic(configs) -> bool:
    return any(parse_config(c)[0] == "dynamic" for c in configs)


def _int_list(name: str, v) -> list[int]:
    if isinstance(v, str):
        try:
            v = [int(x) for x in v.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{name} must be comma-separated integers, got {v!r}") from None
    out = sorted({int(x) for x in v})
    if not out or out[0] < 1:
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {v!r}")
    return out


def rollout_lengths(n: int, median: int, cap: int, sigma: float = 1.0, seed: int = 0,
                    floor: int = 4) -> list[int]:
    """Heavy-tailed output lengths: lognormal(log(median), sigma), clipped to [floor, cap]."""
    rng = np.random.default_rng(seed)
    x = rng.lognormal(math.log(median), sigma, size=n)
    return np.clip(np.round(x), min(floor, cap), cap).astype(int).tolist()


# --------------------------------------------------------------------------- environment

def _git_commit() -> str | None:
    """HEAD commit of a source checkout, read from .git files (no subprocess); else None."""
    try:
        git = Path(__file__).resolve().parent.parent / ".git"
        if git.is_file():  # a worktree: "gitdir: PATH"
            git = Path(git.read_text().split(":", 1)[1].strip())
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head.split(":", 1)[1].strip()
        for base in (git, Path(str(git).split("/worktrees/")[0]) if "/worktrees/" in str(git) else git):
            p = base / ref
            if p.is_file():
                return p.read_text().strip()
            packed = base / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    except (OSError, IndexError, ValueError):
        pass
    return None


def environment() -> dict:
    import jax
    try:
        import jaxlib
        jaxlib_version = getattr(jaxlib, "__version__", None)
    except ImportError:  # pragma: no cover
        jaxlib_version = None
    try:
        from importlib.metadata import version
        dsd_version = version("dsd-jax")
    except Exception:  # noqa: BLE001
        dsd_version = None
    dev = jax.devices()[0]
    return {
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "num_devices": jax.device_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib_version,
        "dsd_jax_version": dsd_version,
        "commit": _git_commit(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# --------------------------------------------------------------------------- the benchmark

def _encode(prompts, tokenizer, vocab: int) -> list[list[int]]:
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer")
            p = tokenizer.encode(p).ids
        p = [int(t) for t in p]
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
        out.append(p)
    if not out:
        raise ValueError("no prompts")
    return out


def _median(xs):
    return float(statistics.median(xs))


class _Runner:
    """Engines, controllers and the bookkeeping of one benchmark."""

    def __init__(self, target, draft, tokenizer, *, configs, max_batch_size, max_seq_len, max_k,
                 batch_buckets, prefill_chunk, compilation_cache_dir, log):
        from dsd_jax.engine import SpecEngine
        self.log = log
        self.configs = configs
        kinds = [parse_config(c) for c in configs]
        self.spec_needed = any(kind != "vanilla" for kind, _ in kinds)
        static_ks = [k for kind, k in kinds if kind == "static"]
        self.max_k = max([max_k] + static_ks) if any(kind == "dynamic" for kind, _ in kinds) else \
            max(static_ks, default=0)
        common = dict(max_batch_size=max_batch_size, max_seq_len=max_seq_len, tokenizer=tokenizer,
                      batch_buckets=batch_buckets, prefill_chunk=prefill_chunk,
                      compilation_cache_dir=compilation_cache_dir)
        self.vanilla = SpecEngine(target, None, SpecConfig(method="none"), **common)
        self.spec = None
        if self.spec_needed:
            if draft is None:
                raise ValueError("speculative configurations need a draft model")
            self.spec = SpecEngine(target, draft, SpecConfig(method="draft_model",
                                                            num_speculative_tokens=self.max_k), **common)
        self.max_batch_size = max_batch_size
        self._dynamic: dict[str, Controller] = {}  # one goodput controller per name, built on first use
        self.profile: Profile | None = None
        self.profile_path: str | None = None

    def engines(self):
        return [e for e in (self.vanilla, self.spec) if e is not None]

    def warmup(self) -> int:
        n = 0
        for e in self.engines():
            t0 = time.perf_counter()
            n += e.warmup()
            self.log(f"  compiled {'vanilla' if e is self.vanilla else f'K=0..{e.max_k}'} engine "
                     f"({len(e.batch_buckets)} batch buckets) in {time.perf_counter() - t0:.1f} s")
        return n

    def controller(self, config: str):
        kind, k = parse_config(config)
        if kind == "vanilla":
            return None
        e = self.spec
        if kind == "static":
            spec = SpecConfig(method="draft_model", num_speculative_tokens=k)
            return Controller(spec, None, self.max_batch_size, batch_buckets=e.batch_buckets)
        if self.profile is None:
            raise RuntimeError("the dynamic configuration needs a profile")
        # One goodput controller for the whole bench, as a serving engine keeps one across
        # calls: live acceptance learnt in earlier runs corrects the profile's estimate.
        if config not in self._dynamic:
            spec = SpecConfig(method="draft_model", num_speculative_tokens=self.max_k,
                              dynamic=DynamicConfig(profile=self.profile_path,
                                                    objective=DYNAMIC_OBJECTIVES[config]))
            self._dynamic[config] = Controller(spec, self.profile, self.max_batch_size,
                                               batch_buckets=e.batch_buckets)
        return self._dynamic[config]

    def run(self, config: str, prompts, sampling):
        """One timed `generate`: (wall seconds, outputs, stats dict)."""
        from dsd_jax.engine import bucket_for
        engine = self.vanilla if config == "vanilla" else self.spec
        ctl = self.controller(config)
        if ctl is not None:
            engine.controller = ctl
        engine.stats.reset()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sampling)
        wall = time.perf_counter() - t0
        st = engine.stats
        # Decode-only: everything after the first step's result (which includes the prefill).
        tr = st.trace
        info = {"tokens": int(st.tokens), "row_steps": int(st.row_steps), "steps": int(st.steps),
                "k_hist": {int(k): int(v) for k, v in sorted(st.k_hist.items())},
                "decode_tokens": int(sum(t["emitted"] for t in tr[1:])),
                "decode_s": float(sum(t["wall_ms"] for t in tr[1:]) / 1e3),
                # (K, batch bucket, wall ms) of every step after the first, for calibration
                "step_ms": [(t["k"], bucket_for(t["batch_size"], engine.batch_buckets), t["wall_ms"])
                            for t in tr[1:]]}
        stats = getattr(ctl, "stats", None)
        if ctl is not None and ctl.mode == "goodput" and callable(stats):
            c = stats()
            info["controller"] = {k: c.get(k) for k in ("itl_mape", "al_mape", "acceptance", "table_refreshes",
                                                         "using_live_acceptance", "probes", "latency_factors")}
        return wall, [o.token_ids for o in outs], info


def _calibration(step_ms, profile: Profile | None) -> list[dict]:
    """Measured step time per (K, bucket) (median over steps) next to the profile's ITL."""
    groups: dict[tuple, list[float]] = {}
    for k, b, ms in step_ms:
        groups.setdefault((int(k), int(b)), []).append(float(ms))
    out = []
    for (k, b), ms in sorted(groups.items()):
        entry = {"k": k, "bucket": b, "steps": len(ms), "measured_ms": round(_median(ms), 3)}
        if profile is not None and k <= profile.max_k:
            pred = profile.itl_ms(b, k)
            entry["profile_ms"] = round(pred, 3)
            entry["measured_over_profile"] = round(entry["measured_ms"] / pred, 3)
        out.append(entry)
    return out


def profile_fit_problems(profile: Profile, engine) -> list[str]:
    """Ways a profile does not describe `engine`'s programs (empty list: it fits)."""
    problems = []
    if profile.max_batch_size < engine.batch_buckets[-1]:
        problems.append(f"the profile covers batch sizes up to {profile.max_batch_size} but the engine runs up "
                        f"to {engine.batch_buckets[-1]}: larger batches use the ITL of "
                        f"{profile.max_batch_size} (clamped)")
    if profile.max_k < engine.max_k:
        problems.append(f"the profile covers K <= {profile.max_k}; the engine allows K <= {engine.max_k}")
    eng = profile.meta.get("engine") if isinstance(profile.meta, dict) else None
    if isinstance(eng, dict) and eng.get("max_seq_len") not in (None, engine.max_seq_len):
        problems.append(f"the profile was measured with max_seq_len {eng.get('max_seq_len')}, the engine has "
                        f"{engine.max_seq_len}: step latency follows the KV-cache size")
    return problems


def _merge_info(a: dict, b: dict) -> dict:
    """The stats of two consecutive runs of one configuration (see `_Runner.run`)."""
    out = {k: a[k] + b[k] for k in ("tokens", "row_steps", "steps", "decode_tokens", "decode_s", "step_ms")}
    out["k_hist"] = _add_hist(a["k_hist"], b["k_hist"])
    out["controller"] = b.get("controller")
    return out


def _add_hist(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


def run_bench(target, draft, tokenizer, prompts, *, batch_sizes=None, configs=None, repeats=None,
              max_tokens=None, profile=None, quick: bool = False, prompt_len: int | None = None,
              rows_per_point: int | None = None, rollout_requests: int | None = None,
              rollout_prompt_len: int | None = None, rollout_median_tokens: int | None = None,
              rollout_max_tokens: int | None = None, max_seq_len: int | None = None,
              max_k: int | None = None, batch_buckets: Sequence[int] | None = None,
              prefill_chunk: int | None = None,
              profile_prompts=None, profile_out: str | os.PathLike | None = None,
              workloads: Sequence[str] = ("sweep", "rollout"), seed: int = 0,
              compilation_cache_dir: str | None = None, runner_hook: Callable | None = None,
              log: Callable[[str], None] | None = print) -> list[dict]:
    """Runs the benchmark; returns the result rows (see the module docstring).

    target, draft: `dsd_jax.models.Transformer`s (draft sharing the target's vocabulary);
    tokenizer: a `tokenizers.Tokenizer` or None (then prompts must be token ids).
    prompts: held-out prompts (strings or token-id lists); at least max(batch_sizes)
        and rollout_requests of them are used, cycling when there are fewer.
    configs: names ("vanilla", "static-K", "dynamic") as a list or a comma-separated
        string; "vanilla" is always added (the speedup baseline and lossless oracle).
    profile: a `Profile`, a path to a profile JSON, or None (profile the shared
        speculative engine now with `profile_engine`; saved to `profile_out` if given).
    quick: defaults from `QUICK` instead of `FULL` for every argument left None.
    runner_hook: called as ``runner_hook(runner)`` once engines are compiled and the
        profile is ready (the demo completes a prompt there).

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
    d = QUICK if quick else FULL
    pick = lambda v, key: d[key] if v is None else v  # noqa: E731
    batch_sizes = _int_list("batch_sizes", pick(batch_sizes, "batch_sizes"))
    configs = _config_list(pick(configs, "configs"))
    repeats = int(pick(repeats, "repeats"))
    max_tokens = int(pick(max_tokens, "max_tokens"))
    prompt_len = int(pick(prompt_len, "prompt_len"))
    rows_per_point = int(pick(rows_per_point, "rows_per_point"))
    max_k = int(pick(max_k, "max_k"))
    workloads = tuple(workloads)
    if not set(workloads) <= {"sweep", "rollout"} or not workloads:
        raise ValueError(f"workloads must be a subset of ('sweep', 'rollout'), got {workloads}")
    do_rollout = "rollout" in workloads
    n_roll = int(pick(rollout_requests, "rollout_requests")) if do_rollout else 0
    roll_prompt_len = int(pick(rollout_prompt_len, "rollout_prompt_len"))
    roll_median = int(pick(rollout_median_tokens, "rollout_median_tokens"))
    if repeats < 1 or max_tokens < 1 or prompt_len < 1 or rows_per_point < 1:
        raise ValueError("repeats, max_tokens, prompt_len and rows_per_point must be >= 1")
    profile_path = None
    if isinstance(profile, (str, os.PathLike)):
        profile_path = os.fspath(profile)
        profile = Profile.load(profile)  # fingerprints and device are checked once the engine exists
    if max_seq_len is None and isinstance(profile, Profile):
        # Step latency depends on the KV-cache size: run at the profile's max_seq_len.
        eng = profile.meta.get("engine") if isinstance(profile.meta, dict) else None
        max_seq_len = eng.get("max_seq_len") if isinstance(eng, dict) else None
    max_seq_len = int(max(pick(max_seq_len, "max_seq_len"), prompt_len + max_tokens))
    roll_cap = int(pick(rollout_max_tokens, "rollout_max_tokens"))
    roll_cap = max(1, min(roll_cap, max_seq_len - roll_prompt_len))
    vocab = target.config.vocab_size
    ids = _encode(prompts, tokenizer, vocab)
    sweep_prompts = [p[:prompt_len] for p in ids]
    roll_prompts = [ids[i % len(ids)][:roll_prompt_len] for i in range(n_roll)]
    max_batch = max(batch_sizes + [n_roll])
    if batch_buckets is None and d["batch_buckets"] is not None and set(batch_sizes) <= set(d["batch_buckets"]) \
            and max_batch <= max(d["batch_buckets"]):
        batch_buckets = d["batch_buckets"]
    if batch_buckets is not None:
        batch_buckets = _int_list("batch_buckets", batch_buckets)
        if batch_buckets[-1] < max_batch:
            batch_buckets.append(max_batch)

    log(f"bench ({'quick' if quick else 'full'}): configs {', '.join(configs)}; batch sizes "
        f"{batch_sizes}; {repeats} repeat(s); {max_tokens} tokens/request (prompts <= {prompt_len} tokens)"
        + (f"; rollout of {n_roll} requests" if n_roll else ""))
    prefill_chunk = pick(prefill_chunk, "prefill_chunk")
    if prefill_chunk is None:  # one chunk covers a prompt: no column padding to 256
        prefill_chunk = min(256, 1 << max(4, (max(prompt_len, roll_prompt_len) - 1).bit_length()))
    runner = _Runner(target, draft, tokenizer, configs=configs, max_batch_size=max_batch,
                     max_seq_len=max_seq_len, max_k=max_k, batch_buckets=batch_buckets,
                     prefill_chunk=int(prefill_chunk),
                     compilation_cache_dir=compilation_cache_dir, log=log)
    log(f"compiling every (K, batch bucket) program (max_seq_len {max_seq_len}) ...")
    t0 = time.perf_counter()
    n_programs = runner.warmup()
    compile_s = time.perf_counter() - t0

    # Profile for the dynamic configuration.
    profile_s = 0.0
    prof_info = None
    if _has_dynamic(configs):
        from dsd_jax.profiler import device_kind, engine_fingerprints
        if profile is None:
            from dsd_jax.profiler import profile_engine
            ctx = min(max_seq_len, prompt_len + max_tokens // 2)
            pp = profile_prompts
            if pp is None:  # disjoint from the sweep's first prompts where there are enough
                n_pp = d["profile_prompts"]
                start = max_batch if len(ids) >= max_batch + n_pp else 0
                pp = [ids[(start + i) % len(ids)] for i in range(n_pp)]
            else:
                pp = _encode(pp, tokenizer, vocab)
            pp = [p[:prompt_len] for p in pp]
            log(f"profiling the speculative engine (context {ctx}, {len(pp)} acceptance prompts) ...")
            t0 = time.perf_counter()
            profile = profile_engine(runner.spec, context_lengths=(ctx,), repeats=d["profile_repeats"],
                                     warmup_reps=d["profile_warmup_reps"], prompts=pp,
                                     acceptance_max_tokens=d["profile_max_tokens"], temperatures=(0.0,))
            profile_s = time.perf_counter() - t0
            source = "profiled now"
            if profile_out:
                profile.save(profile_out)
                runner.profile_path = os.fspath(profile_out)
                source += f", saved to {os.fspath(profile_out)}"
        elif isinstance(profile, Profile):
            runner.profile_path = profile_path
            source = f"loaded from {profile_path}" if profile_path else "given"
            profile.check_compatible(engine_fingerprints(runner.spec), device_kind(), source=source)
            for problem in profile_fit_problems(profile, runner.spec):
                log(f"  WARNING: {problem}")
        else:
            raise ValueError(f"profile must be a Profile, a path or None, got {type(profile).__name__}")
        runner.profile = profile
        prof_info = {"source": source, "path": runner.profile_path, "acceptance": list(profile.acceptance),
                     "batch_sizes": list(profile.batch_sizes), "ks": list(profile.ks),
                     "context_lengths": list(profile.context_lengths), "device_kind": profile.device_kind,
                     "seconds": round(profile_s, 2)}
        log("  profile acceptance a_i: " + " ".join(f"{a:.2f}" for a in profile.acceptance)
            + f" ({source}{f', {profile_s:.1f} s' if profile_s else ''})")

    if runner_hook is not None:
        runner_hook(runner)

    # Untimed warm-up run per configuration: the live batch shrinks through every bucket.
    t0 = time.perf_counter()
    warm_n = max_batch
    warm_prompts = [sweep_prompts[i % len(sweep_prompts)][:16] for i in range(warm_n)]
    warm_sp = [SamplingParams(temperature=0.0, max_tokens=1 + (i * 8) // warm_n) for i in range(warm_n)]
    for c in configs:
        runner.run(c, warm_prompts, warm_sp)
    warm_s = time.perf_counter() - t0

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    timings: dict[tuple, list[float]] = {}
    outputs: dict[tuple, list] = {}
    infos: dict[tuple, list[dict]] = {}
    # tokens/s of every interleaved pair unit (one prompt group of one repeat; the rollout
    # of one repeat), in the same order for every configuration: the paired intervals
    pairs: dict[tuple, list[float]] = {}
    rotation = 0

    def order():
        nonlocal rotation
        r = rotation % len(configs)
        rotation += 1
        return configs[r:] + configs[:r]

    t0 = time.perf_counter()
    lengths = rollout_lengths(n_roll, roll_median, roll_cap, seed=seed) if do_rollout else []
    roll_sp = [SamplingParams(temperature=0.0, max_tokens=m) for m in lengths]
    for rep in range(repeats):
        if "sweep" in workloads:
            for b in batch_sizes:
                groups = max(1, -(-rows_per_point // b))
                sets = [[sweep_prompts[(g * b + i) % len(sweep_prompts)] for i in range(b)]
                        for g in range(groups)]
                # Configurations take turns group by group, so a slow stretch of the machine
                # lasting a few seconds is shared out instead of landing on one configuration.
                acc: dict[str, tuple] = {c: (0.0, [], None) for c in configs}
                for s in sets:
                    for c in order():
                        w, o, inf = runner.run(c, s, greedy)
                        pairs.setdefault(("sweep", b, c), []).append(inf["tokens"] / w)
                        wall, outs, info = acc[c]
                        acc[c] = (wall + w, outs + o, inf if info is None else _merge_info(info, inf))
                for c, (wall, outs, info) in acc.items():
                    key = ("sweep", b, c)
                    timings.setdefault(key, []).append(wall)
                    outputs.setdefault(key, []).append(outs)
                    infos.setdefault(key, []).append(info)
                log(f"  [repeat {rep + 1}/{repeats}] sweep B={b}: " + ", ".join(
                    f"{c} {infos[('sweep', b, c)][-1]['tokens'] / timings[('sweep', b, c)][-1]:.0f}"
                    for c in configs) + " tok/s")
        if do_rollout:
            for c in order():
                wall, outs, info = runner.run(c, roll_prompts, roll_sp)
                key = ("rollout", None, c)
                pairs.setdefault(key, []).append(info["tokens"] / wall)
                timings.setdefault(key, []).append(wall)
                outputs.setdefault(key, []).append(outs)
                infos.setdefault(key, []).append(info)
            log(f"  [repeat {rep + 1}/{repeats}] rollout of {n_roll}: " + ", ".join(
                f"{c} {timings[('rollout', None, c)][-1]:.2f} s" for c in configs) + " makespan")
    timed_s = time.perf_counter() - t0

    rows: list[dict] = []
    all_lossless = True
    for (workload, b, c), walls in timings.items():
        ref = outputs[(workload, b, "vanilla")][0]
        mism = [sum(o != r for o, r in zip(outs, ref)) for outs in outputs[(workload, b, c)]]
        lossless = all(m == 0 for m in mism)
        all_lossless &= lossless
        reps = infos[(workload, b, c)]
        info = reps[0]
        tokens = info["tokens"]  # greedy: every repeat generates the same tokens
        # the dynamic controller persists across runs, so its repeats may take different Ks
        k_hist: dict = {}
        for i in reps:
            k_hist = _add_hist(k_hist, i["k_hist"])
        row_steps = sum(i["row_steps"] for i in reps)
        row: dict[str, Any] = {"workload": workload}
        if workload == "sweep":
            row.update(batch_size=b, config=c)
            tps = [tokens / w for w in walls]
            row["tokens_per_s"] = _median(tps)
            row["wall_s"] = _median(walls)
            row["prompts"] = len(outputs[(workload, b, c)][0])
        else:
            row["config"] = c
            row["makespan_s"] = _median(walls)
            row["tokens_per_s"] = tokens / row["makespan_s"]
            tps = [tokens / w for w in walls]
            row["num_requests"] = n_roll
        dec = [i["decode_tokens"] / i["decode_s"] for i in reps if i["decode_s"] > 0]
        row.update(decode_tokens_per_s=_median(dec) if dec else None,
                   tokens=tokens, steps=info["steps"],
                   mean_accepted_len=tokens * len(reps) / row_steps if row_steps else None,
                   k_hist={str(k): v for k, v in k_hist.items()},
                   lossless=lossless, mismatched_requests=max(mism),
                   tokens_per_s_repeats=[round(x, 3) for x in tps], repeats=len(walls),
                   tokens_per_s_pairs=[round(x, 3) for x in pairs[(workload, b, c)]],
                   step_calibration=_calibration([x for i in reps for x in i["step_ms"]], runner.profile))
        if info.get("controller") is not None:
            row["controller"] = reps[-1]["controller"]
        rows.append(row)
    rows.sort(key=lambda r: (r["workload"] != "sweep", r.get("batch_size") or 0, configs.index(r["config"])))
    base = {(r["workload"], r.get("batch_size")): r["tokens_per_s"] for r in rows if r["config"] == "vanilla"}
    dbase = {(r["workload"], r.get("batch_size")): r["decode_tokens_per_s"] for r in rows
             if r["config"] == "vanilla"}
    for r in rows:
        key = (r["workload"], r.get("batch_size"))
        r["speedup_vs_vanilla"] = r["tokens_per_s"] / base[key]
        r["decode_speedup_vs_vanilla"] = (r["decode_tokens_per_s"] / dbase[key]
                                          if r["decode_tokens_per_s"] and dbase[key] else None)
    add_intervals(rows)
    meta = {"workload": "meta", "quick": bool(quick), "configs": configs, "batch_sizes": batch_sizes,
            "repeats": repeats, "max_tokens": max_tokens, "prompt_len": prompt_len,
            "rows_per_point": rows_per_point, "max_seq_len": max_seq_len, "max_k": runner.max_k,
            "batch_buckets": list((runner.spec or runner.vanilla).batch_buckets),
            "rollout": {"num_requests": n_roll, "prompt_len": roll_prompt_len, "lengths": lengths,
                        "median_tokens": roll_median, "max_tokens": roll_cap,
                        "distribution": "lognormal(log(median), 1.0), clipped"} if do_rollout else None,
            "temperature": 0.0, "lossless": all_lossless, "profile": prof_info,
            "engines": "vanilla: own engine (method none); static-K and dynamic: one shared draft-model "
                       f"engine compiled for K=0..{runner.max_k}, controller swapped per run",
            "programs_compiled": n_programs,
            "seconds": {"compile": round(compile_s, 2), "profile": round(profile_s, 2),
                        "warmup_runs": round(warm_s, 2), "timed": round(timed_s, 2),
                        "total": round(time.perf_counter() - t_start, 2)}}
    rows.append(meta)
    if not all_lossless:
        bad = [(r["workload"], r.get("batch_size"), r["config"]) for r in rows
               if r["workload"] != "meta" and not r["lossless"]]
        log(f"WARNING: outputs differ from vanilla's (greedy) for {bad}: NOT lossless")
    return rows


# --------------------------------------------------------------------------- reporting

def _points(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(workload, batch size) -> config -> row, for the sweep and rollout rows."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["workload"] in ("sweep", "rollout"):
            out.setdefault((r["workload"], r.get("batch_size")), {})[r["config"]] = r
    return out


def _throughput_score(r: dict) -> float:
    """Geometric mean of the paired tokens/s (the ranking the paired ratios give), else the median."""
    pairs = r.get("tokens_per_s_pairs")
    return float(np.exp(np.mean(np.log(pairs)))) if pairs else r["tokens_per_s"]


def _best_static(pts: dict[str, dict]) -> str | None:
    """The static-K configuration with the highest throughput at a point (None: none ran),
    ranked as the paired ratios rank them. Chosen from the same data it is then compared
    with, so "better than the best static" is, if anything, slightly understated."""
    statics = {c: _throughput_score(r) for c, r in pts.items() if parse_config(c)[0] == "static"}
    return max(statics, key=statics.get) if statics else None


def _pair_ratios(pts: dict[str, dict], baseline: str | None) -> dict[str, dict | None]:
    """Each configuration's paired interval against `baseline` at one point (None without pairs)."""
    samples = {c: r.get("tokens_per_s_pairs") for c, r in pts.items()}
    return stats.ratios_to(samples, baseline) if baseline else {c: None for c in pts}


def add_intervals(rows: list[dict]) -> list[dict]:
    """Sets ``vs_vanilla``, ``best_static`` and ``vs_best_static`` (paired bootstrap ratios of
    tokens/s, `dsd_jax.stats.paired_ratio`) on every sweep and rollout row, in place."""
    for pts in _points(rows).values():
        best = _best_static(pts)
        vs_v, vs_s = _pair_ratios(pts, "vanilla"), _pair_ratios(pts, best)
        for c, r in pts.items():
            r["vs_vanilla"], r["best_static"], r["vs_best_static"] = vs_v[c], best, vs_s[c]
    return rows


def _differences(points: dict[tuple, dict[str, dict]]) -> list[dict]:
    """Every configuration against vanilla and against the best static K, with the verdict
    of its interval ("higher"/"lower": the interval excludes 1; else "unresolved")."""
    out = []
    for (workload, b), pts in points.items():
        best = _best_static(pts)
        for baseline, ratios in (("vanilla", _pair_ratios(pts, "vanilla")), (best, _pair_ratios(pts, best))):
            for c, res in ratios.items():
                if res is None or c == baseline or (baseline == best and c == "vanilla"):
                    continue
                out.append({"workload": workload, "batch_size": b, "config": c, "baseline": baseline,
                            **res, "real": stats.is_real(res), "verdict": stats.verdict(res),
                            "resolution": stats.resolution(res)})
    return out


def summarize(rows: list[dict]) -> dict:
    """Dynamic vs the best other configuration per sweep batch size and for the rollout, and
    which differences between configurations the paired intervals resolve."""
    data = [r for r in rows if r["workload"] in ("sweep", "rollout")]
    points = _points(rows)
    out: dict[str, Any] = {"sweep": [], "rollout": None,
                           "lossless": all(r["lossless"] for r in data)}
    sizes = sorted({r["batch_size"] for r in data if r["workload"] == "sweep"})
    for b in sizes:
        rows_b = points[("sweep", b)]
        pts = {c: r["tokens_per_s"] for c, r in rows_b.items()}
        others = {c: v for c, v in pts.items() if parse_config(c)[0] != "dynamic"}
        best_c = max(others, key=others.get)
        entry = {"batch_size": b, "best_config": max(pts, key=pts.get), "best_other": best_c,
                 "best_speedup_vs_vanilla": max(pts.values()) / pts["vanilla"]}
        if "dynamic" in pts:
            entry["dynamic_vs_best_other"] = pts["dynamic"] / others[best_c]
            entry["dynamic_vs_best_other_ci"] = _pair_ratios(rows_b, best_c)["dynamic"]
        # run-to-run noise at this point: the median over configurations of the spread
        # (max - min) / median of their repeats; a gap smaller than this is not a finding
        spreads = [(max(r) - min(r)) / statistics.median(r) for r in
                   (x.get("tokens_per_s_repeats") or [] for x in rows_b.values()) if len(r) > 1]
        entry["repeat_spread"] = statistics.median(spreads) if spreads else None
        # what the paired intervals resolve here: the median half-width against vanilla
        widths = [w for w in (stats.resolution(x) for c, x in _pair_ratios(rows_b, "vanilla").items()
                              if c != "vanilla") if w is not None]
        entry["resolution"] = statistics.median(widths) if widths else None
        out["sweep"].append(entry)
    # Smallest batch size from which on no static K beats vanilla any more.
    out["speculation_stops_paying_at"] = None
    spec_gain = []
    for b in sizes:
        pts = {r["config"]: r["tokens_per_s"] for r in data if r["workload"] == "sweep" and r["batch_size"] == b}
        statics = [v for c, v in pts.items() if c.startswith("static")]
        if statics and "vanilla" in pts:
            spec_gain.append((b, max(statics) / pts["vanilla"]))
    for i, (b, _) in enumerate(spec_gain):
        if all(g <= 1.0 for _, g in spec_gain[i:]):
            out["speculation_stops_paying_at"] = b
            break
    roll = {r["config"]: r["makespan_s"] for r in data if r["workload"] == "rollout"}
    if roll:
        others = {c: v for c, v in roll.items() if parse_config(c)[0] != "dynamic"}
        best_c = min(others, key=others.get)
        out["rollout"] = {"best_other": best_c, "best_other_makespan_s": others[best_c],
                          "vanilla_makespan_s": roll.get("vanilla")}
        if "dynamic" in roll:
            out["rollout"]["dynamic_makespan_s"] = roll["dynamic"]
            out["rollout"]["dynamic_vs_best_other"] = roll["dynamic"] / others[best_c]
            # a makespan ratio like dynamic_vs_best_other (below 1: dynamic finished sooner)
            out["rollout"]["dynamic_vs_best_other_ci"] = stats.reciprocal(
                _pair_ratios(points[("rollout", None)], best_c)["dynamic"])
    out["differences"] = _differences(points)
    return out


def _fmt_hist(h: dict) -> str:
    total = sum(h.values()) or 1
    return " ".join(f"K{k}:{100 * v / total:.0f}%" for k, v in sorted(h.items(), key=lambda kv: int(kv[0])))


def _speedup_cell(r: dict) -> str:
    """``1.23x [1.18, 1.29]*`` (paired 95% interval; * = real) or ``(1.23x)`` without pairs."""
    return stats.format_ratio(r["vs_vanilla"]) if r.get("vs_vanilla") else f"({r['speedup_vs_vanilla']:.2f}x)"


def _differences_lines(s: dict) -> list[str]:
    """The summary's verdicts: which differences the paired intervals resolve, which not."""
    where = lambda d: "rollout" if d["workload"] == "rollout" else f"B={d['batch_size']}"  # noqa: E731
    real = [d for d in s.get("differences", []) if d["real"]]
    unresolved = [d for d in s.get("differences", []) if not d["real"] and d.get("lo") is not None]
    lines = ["differences the data resolve (paired 95% interval excludes 1): "
             + (str(len(real)) if real else "none")]
    lines += [f"  {where(d)}: {d['config']} {d['verdict']} than {d['baseline']}: {stats.format_ratio(d)}"
              for d in real]
    if unresolved:
        lines.append("not resolved (interval contains 1): " + "; ".join(
            f"{where(d)} {d['config']} vs {d['baseline']} {stats.format_ratio(d)}" for d in unresolved))
    return lines


def format_table(rows: list[dict]) -> str:
    """Batch size x config (tokens/s and speedup over vanilla with its paired 95% interval),
    dynamic's K histogram, ratios to the best static K, rollout, and which differences are real."""
    sweep = [r for r in rows if r["workload"] == "sweep"]
    roll = [r for r in rows if r["workload"] == "rollout"]
    meta = next((r for r in rows if r["workload"] == "meta"), {})
    configs = meta.get("configs") or list(dict.fromkeys(r["config"] for r in sweep + roll))
    lines = []
    if sweep:
        cells_of = {(r["batch_size"], r["config"]): f"{r['tokens_per_s']:.1f} {_speedup_cell(r)}" for r in sweep}
        w = max([len(c) for c in configs] + [len(x) for x in cells_of.values()])
        lines.append("sweep: tokens/s and speedup over vanilla [paired 95% interval; * = real], greedy, "
                     f"{meta.get('max_tokens', '?')} tokens per request")
        lines.append(f"{'batch':>5} | " + " | ".join(f"{c:>{w}}" for c in configs)
                     + (" | dynamic K histogram" if "dynamic" in configs else ""))
        for b in sorted({r["batch_size"] for r in sweep}):
            line = f"{b:>5} | " + " | ".join(f"{cells_of.get((b, c), '-'):>{w}}" for c in configs)
            dyn = next((r for r in sweep if r["batch_size"] == b and r["config"] == "dynamic"), None)
            if dyn is not None:
                line += " | " + _fmt_hist(dyn["k_hist"])
            lines.append(line)
    if sweep and any(r.get("vs_best_static") for r in sweep):
        lines.append("ratio to the best static K at each batch size [paired 95% interval; * = real]:")
        for b in sorted({r["batch_size"] for r in sweep}):
            pts = [r for r in sweep if r["batch_size"] == b and r.get("vs_best_static")]
            if pts:
                lines.append(f"{b:>5} | best {pts[0]['best_static']}: " + "  ".join(
                    f"{r['config']} {stats.format_ratio(r['vs_best_static'])}" for r in pts
                    if r["config"] != r["best_static"]))
    if sweep and any(r.get("decode_speedup_vs_vanilla") for r in sweep):
        lines.append("decode-only speedup over vanilla (prefill and first step excluded):")
        for b in sorted({r["batch_size"] for r in sweep}):
            pts = {r["config"]: r for r in sweep if r["batch_size"] == b}
            lines.append(f"{b:>5} | " + "  ".join(
                f"{c} {pts[c]['decode_speedup_vs_vanilla']:.2f}x" for c in configs
                if c in pts and pts[c].get("decode_speedup_vs_vanilla")))
    if sweep and any(c.get("profile_ms") for r in sweep for c in r.get("step_calibration") or []):
        lines.append("step time measured in the runs / profiled ITL (the batch's own bucket, its most common K):")
        for b in sorted({r["batch_size"] for r in sweep}):
            cells = []
            for c in configs:
                r = next((r for r in sweep if r["batch_size"] == b and r["config"] == c), None)
                cal = [e for e in (r or {}).get("step_calibration") or [] if e.get("profile_ms")]
                if cal:
                    # the steps at the batch's own bucket, not the tail after early finishers left
                    own = min((e["bucket"] for e in cal if e["bucket"] >= b), default=None)
                    e = max([e for e in cal if e["bucket"] == own] or cal, key=lambda e: e["steps"])
                    cells.append(f"{c} K{e['k']}: {e['measured_ms']:.1f}/{e['profile_ms']:.1f} ms "
                                 f"({e['measured_over_profile']:.2f})")
            lines.append(f"{b:>5} | " + "  ".join(cells))
    if roll:
        n = meta.get("rollout", {}) or {}
        lines.append(f"rollout: {n.get('num_requests', '?')} requests, heavy-tailed lengths "
                     f"(median {n.get('median_tokens', '?')}, max {max(n.get('lengths') or [0])})")
        for r in roll:
            lines.append(f"  {r['config']:>12}: makespan {r['makespan_s']:.2f} s, "
                         f"{r['tokens_per_s']:.1f} tok/s {_speedup_cell(r)}"
                         + (f", K histogram {_fmt_hist(r['k_hist'])}"
                            if parse_config(r["config"])[0] == "dynamic" else ""))
    learnt = [r["controller"] for r in sweep + roll if r["config"] == "dynamic" and r.get("controller")]
    if learnt and learnt[-1].get("latency_factors"):
        lines.append(f"dynamic's learnt step time / profiled ITL per batch bucket, K = 0.. "
                     f"({learnt[-1].get('probes', 0)} probe steps):")
        for bucket, factors in sorted(learnt[-1]["latency_factors"].items(), key=lambda x: int(x[0])):
            lines.append(f"{bucket:>5} | " + " ".join(f"{f:.2f}" for f in factors))
    s = summarize(rows)
    for e in s["sweep"]:
        if "dynamic_vs_best_other" in e:
            spread, ci = e.get("repeat_spread"), e.get("dynamic_vs_best_other_ci")
            lines.append(f"  B={e['batch_size']:>3}: dynamic = {e['dynamic_vs_best_other']:.2f} x best other "
                         f"({e['best_other']})" + (f", paired {stats.format_ratio(ci)}" if ci else "")
                         + (f"; repeats spread {100 * spread:.0f}%" if spread else ""))
    if s["rollout"] and "dynamic_vs_best_other" in s["rollout"]:
        ci = s["rollout"].get("dynamic_vs_best_other_ci")
        lines.append(f"  rollout: dynamic makespan = {s['rollout']['dynamic_vs_best_other']:.2f} x best other "
                     f"({s['rollout']['best_other']})" + (f", paired {stats.format_ratio(ci)}" if ci else ""))
    lines += _differences_lines(s)
    lines.append("lossless (greedy outputs identical to vanilla's): " + ("yes" if s["lossless"] else "NO"))
    return "\n".join(lines)


def write_json(rows: list[dict], path: str | os.PathLike, env: dict | None = None) -> None:
    doc = {"schema": "dsd_jax.bench/1", "environment": env or environment(),
           "summary": summarize(rows), "rows": rows}
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def _batch_axis(ax, sweep):
    from matplotlib.ticker import NullFormatter
    sizes = sorted({r["batch_size"] for r in sweep})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())


def write_plot(rows: list[dict], path: str | os.PathLike, title: str | None = None) -> None:
    """tokens/s vs batch size per configuration (log2 x) and the rollout makespan bars."""
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: no global backend state is touched

    sweep = [r for r in rows if r["workload"] == "sweep"]
    roll = [r for r in rows if r["workload"] == "rollout"]
    meta = next((r for r in rows if r["workload"] == "meta"), {})
    configs = meta.get("configs") or list(dict.fromkeys(r["config"] for r in sweep + roll))
    ncols = int(bool(sweep)) + int(bool(roll)) + int(bool(sweep))
    fig = Figure(figsize=(5.2 * max(ncols, 1), 4.2))
    axes = list(fig.subplots(1, max(ncols, 1), squeeze=False)[0])
    cmap = matplotlib.colormaps["tab10"]
    colors = {c: cmap(i % 10) for i, c in enumerate(configs)}
    style = lambda c: dict(color=colors[c], lw=2.6 if c == "dynamic" else 1.4,  # noqa: E731
                           ls="--" if c == "vanilla" else "-", marker="o", ms=4)
    if sweep:
        ax = axes.pop(0)
        for c in configs:
            pts = sorted((r["batch_size"], r["tokens_per_s"]) for r in sweep if r["config"] == c)
            if pts:
                ax.plot(*zip(*pts), label=c, **style(c))
        _batch_axis(ax, sweep)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("tokens/s (generated)")
        ax.set_title("throughput vs batch size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes.pop(0)
        for c in configs:
            pts = sorted((r["batch_size"], r["speedup_vs_vanilla"]) for r in sweep if r["config"] == c)
            if pts:
                ax.plot(*zip(*pts), label=c, **style(c))
            cis = [(r["batch_size"], r["vs_vanilla"]) for r in sweep if r["config"] == c and c != "vanilla"
                   and (r.get("vs_vanilla") or {}).get("lo") is not None]
            if cis:  # the paired 95% intervals
                ax.vlines([b for b, _ in cis], [x["lo"] for _, x in cis], [x["hi"] for _, x in cis],
                          color=colors[c], lw=4, alpha=0.35)
        ax.axhline(1.0, color="gray", lw=0.8)
        _batch_axis(ax, sweep)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over vanilla")
        ax.set_title("speedup vs batch size (bars: paired 95% intervals)")
        ax.grid(True, which="both", alpha=0.3)
    if roll:
        ax = axes.pop(0)
        names = [c for c in configs if any(r["config"] == c for r in roll)]
        vals = [next(r["makespan_s"] for r in roll if r["config"] == c) for c in names]
        bars = ax.bar(range(len(names)), vals, color=[colors[c] for c in names])
        for bar, v in zip(bars, vals):
            ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        n = (meta.get("rollout") or {}).get("num_requests", "")
        ax.set_ylabel("makespan (s)")
        ax.set_title(f"rollout of {n} heavy-tailed requests")
        ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------- entry points

def _builtin_prompts(n: int) -> list[str]:
    from dsd_jax.models import heldout_prompts
    return heldout_prompts(n)


def _shipped_profile(quick: bool, log=print) -> str | None:
    """`models/builtin/profile.json` if it exists and covers this run's batch sizes and Ks."""
    from dsd_jax.models.builtin import BUILTIN_DIR
    p = Path(BUILTIN_DIR) / "profile.json"
    if not p.is_file():
        return None
    d = QUICK if quick else FULL
    try:
        prof = Profile.load(p)
    except ValueError as e:
        log(f"ignoring the shipped profile: {e}")
        return None
    need_b = max(max(d["batch_sizes"]), d["rollout_requests"])
    eng = prof.meta.get("engine") if isinstance(prof.meta, dict) else None
    seq = eng.get("max_seq_len") if isinstance(eng, dict) else None
    if prof.max_batch_size < need_b or prof.max_k < d["max_k"] or seq != d["max_seq_len"]:
        log(f"the shipped profile {p} covers B <= {prof.max_batch_size}, K <= {prof.max_k} at max_seq_len "
            f"{seq}; this run needs B <= {need_b}, K <= {d['max_k']} at max_seq_len {d['max_seq_len']}: "
            "profiling now instead")
        return None
    return str(p)


def _load_models(args):
    from dsd_jax import cli
    target, draft, tokenizer, source = cli._load_models("bench", args)
    return target, draft, tokenizer, source


def main(args) -> int:
    """`dsd-jax bench` (args from the CLI's argparse; see `dsd_jax.cli`)."""
    quick = bool(getattr(args, "quick", False))
    target, draft, tokenizer, source = _load_models(args)
    d = QUICK if quick else FULL
    configs = getattr(args, "configs", None) or d["configs"]
    batch_sizes = getattr(args, "batch_sizes", None) or d["batch_sizes"]
    n_prompts = max(max(_int_list("batch_sizes", batch_sizes)), d["rollout_requests"]) + d["profile_prompts"]
    if source == "builtin":
        prompts = _builtin_prompts(n_prompts)
    else:
        if tokenizer is None:
            raise SystemExit("dsd-jax bench: custom models without a tokenizer are not supported "
                             "(the prompts are the built-in held-out code prompts; pass --tokenizer)")
        prompts = _builtin_prompts(n_prompts)
    profile = getattr(args, "profile", None)
    if profile is None and source == "builtin" and _has_dynamic(_config_list(configs)):
        profile = _shipped_profile(quick)
    out_json = getattr(args, "json", None)
    out_plot = getattr(args, "plot", None)
    profile_out = None
    if profile is None and out_json:
        profile_out = os.path.splitext(out_json)[0] + ".profile.json"
    rows = run_bench(target, draft, tokenizer, prompts, batch_sizes=batch_sizes, configs=configs,
                     repeats=getattr(args, "repeats", None), max_tokens=getattr(args, "max_tokens", None),
                     profile=profile, quick=quick, profile_out=profile_out,
                     compilation_cache_dir=getattr(args, "compilation_cache_dir", None))
    print(format_table(rows))
    if out_json:
        write_json(rows, out_json)
        print(f"wrote {out_json}")
    if out_plot:
        write_plot(rows, out_plot, title=f"dsd-jax bench ({source} models)")
        print(f"wrote {out_plot}")
    return 0 if summarize(rows)["lossless"] else 1


DEMO_PROMPT_INDEX = 22  # a held-out prompt (the built-in pair is small: its completions are rough)


def demo(args) -> int:
    """`dsd-jax demo`: complete a held-out prompt with the built-in pair, then `bench --quick`."""
    t_start = time.perf_counter()
    quick = bool(getattr(args, "quick", True))
    out_dir = Path(getattr(args, "out_dir", None) or "dsd_jax_demo")
    out_dir.mkdir(parents=True, exist_ok=True)
    from dsd_jax.models import builtin
    print("loading the built-in model pair ...", flush=True)
    target, draft, tokenizer = builtin()
    d = QUICK if quick else FULL
    n_prompts = max(max(d["batch_sizes"]), d["rollout_requests"]) + d["profile_prompts"]
    prompts = _builtin_prompts(max(n_prompts, DEMO_PROMPT_INDEX) + 1)
    demo_prompt = prompts.pop(DEMO_PROMPT_INDEX)  # not among the benchmark's prompts
    shipped = _shipped_profile(quick)
    profile = shipped
    profile_out = None if shipped else out_dir / "profile.json"

    def complete(runner):
        engine = runner.spec or runner.vanilla
        if runner.spec is not None and runner.profile is not None:
            engine.controller = runner.controller("dynamic")
        engine.stats.reset()
        t0 = time.perf_counter()
        out = engine.generate([demo_prompt], SamplingParams(temperature=0.0, max_tokens=96,
                                                            stop_token_ids=(0,)))[0]
        dt = time.perf_counter() - t0
        bar = "-" * 72
        print(f"\n{bar}\nheld-out prompt + completion (greedy, dynamic K; completion after '<<<'):\n{bar}")
        print(demo_prompt + "<<<" + (out.text or ""))
        print(bar)
        st = engine.stats
        print(f"{len(out.token_ids)} tokens in {dt:.2f} s; K used per step: {_fmt_hist(st.k_hist)}; "
              f"mean tokens per step {st.tokens / max(st.row_steps, 1):.2f}\n", flush=True)

    rows = run_bench(target, draft, tokenizer, prompts, quick=quick, profile=profile,
                     profile_out=profile_out, runner_hook=complete,
                     compilation_cache_dir=str(out_dir / "xla_cache"),
                     log=lambda s: print(s, flush=True))
    json_path, plot_path = out_dir / "bench.json", out_dir / "bench.png"
    write_json(rows, json_path)
    write_plot(rows, plot_path, title="dsd-jax demo: built-in pair, " + ("quick" if quick else "full") + " bench")
    print()
    print(format_table(rows))
    s = summarize(rows)
    print(f"\nwrote {json_path} and {plot_path}"
          + (f"; profile {profile_out}" if profile_out else f"; used the shipped profile {shipped}"))
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0 if s["lossless"] else 1
