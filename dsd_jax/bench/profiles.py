"""The profiles behind the bench's dynamic configurations: loaded and checked, or measured now.

A dynamic configuration is the goodput controller,
``Controller(SpecConfig(method=M, num_speculative_tokens=max_k,
dynamic=DynamicConfig(profile=...)), profile, max_batch_size, batch_buckets=...)``,
with a profile of method M's engine (each method its own: the draft model's for
``dynamic``, the EAGLE-3 head's for ``eagle3-dynamic``) made by
`dsd_jax.profiler.profile_engine` on the bench's own engine, or one given
(``--profile`` / ``--eagle3-profile``, the built-in pair's shipped one).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dsd_jax.bench.environment import file_sha256, portable_path
from dsd_jax.bench.settings import Settings, mode
from dsd_jax.bench.workloads import profile_prompts
from dsd_jax.loading import encode_prompts
from dsd_jax.profile import Profile


def load(profile) -> tuple[Profile | None, str | None]:
    """(Profile or None, the path it came from); fingerprints and the device are checked once
    the engine exists (`prepare`)."""
    if isinstance(profile, (str, os.PathLike)):
        return Profile.load(profile), os.fspath(profile)
    if profile is not None and not isinstance(profile, Profile):
        raise ValueError(f"profile must be a Profile, a path or None, got {type(profile).__name__}")
    return profile, None


def profile_fit_problems(profile: Profile, engine) -> list[str]:
    """Ways a profile does not describe `engine`'s programs (empty list: it fits)."""
    return profile.fit_problems(engine.max_k, engine.batch_buckets[-1], engine.max_seq_len,
                                engine.batch_buckets[0])


def _measure(engine, method: str, s: Settings, prompts: list[list[int]], log) -> Profile:
    from dsd_jax.profiler import profile_engine
    d = mode(s.quick)
    ctx = min(s.max_seq_len, s.prompt_len + s.max_tokens // 2)
    log(f"profiling the {method} engine (context {ctx}, {len(prompts)} acceptance prompts) ...")
    return profile_engine(engine, context_lengths=(ctx,), repeats=d["profile_repeats"],
                          warmup_reps=d["profile_warmup_reps"], prompts=prompts,
                          acceptance_max_tokens=d["profile_max_tokens"], temperatures=(0.0,))


def _check(engine, profile: Profile, path: str | None, log) -> str:
    from dsd_jax.profiler import device_kind, engine_fingerprints
    source = f"loaded from {portable_path(path)}" if path else "given"
    profile.check_compatible(engine_fingerprints(engine), device_kind(engine.placement.device), engine.placement.sizes, source=source,
                             expect_kernel_backends=engine.kernel_backends)
    for problem in profile_fit_problems(profile, engine):
        log(f"  WARNING: {problem}")
    return source


def prepare(runner, s: Settings, profile: Profile | None, path: str | None, *, ids, given_prompts,
            tokenizer, vocab: int, profile_out, log, method: str = "draft_model") -> dict:
    """Gives the runner the profile of `method`'s engine: `profile` checked against that
    engine, or one measured now (acceptance on `given_prompts`, else on held-out `ids`; saved
    to `profile_out` if given). Returns what the results record about it."""
    t0 = time.perf_counter()
    engine = runner.by_method[method]
    if profile is None:
        n = mode(s.quick)["profile_prompts"]
        prompts = (profile_prompts(s, ids, n) if given_prompts is None else
                   [p[:s.prompt_len] for p in encode_prompts(given_prompts, tokenizer, vocab)])
        profile = _measure(engine, method, s, prompts, log)
        source = "profiled now"
        if profile_out:
            profile.save(profile_out)
            path = os.fspath(profile_out)
            source += f", saved to {portable_path(path)}"
        seconds = time.perf_counter() - t0
    else:
        source, seconds = _check(engine, profile, path, log), 0.0
    runner.profiles[method], runner.profile_paths[method] = profile, path
    log(f"  {method} profile acceptance a_i: " + " ".join(f"{a:.2f}" for a in profile.acceptance)
        + f" ({source}{f', {seconds:.1f} s' if seconds else ''})")
    return {"source": source, "path": portable_path(path) if path else None,
            "sha256": file_sha256(path) if path else None, "acceptance": list(profile.acceptance),
            "batch_sizes": list(profile.batch_sizes), "ks": list(profile.ks),
            "context_lengths": list(profile.context_lengths), "device_kind": profile.device_kind,
            "seconds": round(seconds, 2)}


def shipped_profile(quick: bool, log=print) -> str | None:
    """`models/builtin/profile.json` if it exists and covers this run's batch sizes and Ks."""
    from dsd_jax.models.builtin import BUILTIN_DIR
    p = Path(BUILTIN_DIR) / "profile.json"
    if not p.is_file():
        return None
    d = mode(quick)
    try:
        prof = Profile.load(p)
    except ValueError as e:
        log(f"ignoring the shipped profile: {e}")
        return None
    need_b = max(max(d["batch_sizes"]), d["rollout_requests"])
    seq = prof.max_seq_len
    if prof.max_batch_size < need_b or prof.max_k < d["max_k"] or seq != d["max_seq_len"]:
        log(f"the shipped profile {p} covers B <= {prof.max_batch_size}, K <= {prof.max_k} at max_seq_len "
            f"{seq}; this run needs B <= {need_b}, K <= {d['max_k']} at max_seq_len {d['max_seq_len']}: "
            "profiling now instead")
        return None
    return str(p)
