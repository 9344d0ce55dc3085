"""The ``e2e`` section: the engine with the XLA backend and the Pallas one must give the same tokens."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import jax
import numpy as np

from dsd_jax.divergence import first_divergence, top2_gap_at

from .compile import precompile
from .settings import Settings, _guard, _unless_expired, progress


def _random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=length - i % 3).tolist() for i in range(n)]


def _compiled_engine(label: str, target, draft, spec, prompts, s: Settings, max_seq_len: int,
                     tokenizer=None, backend="auto"):
    """(An engine serving `prompts` as one batch bucket, the `precompile` summary): what its
    `generate` runs is compiled side by side first (on the H200 threads compiled 3.7x
    faster than one at a time)."""
    import dsd_jax as dsd
    from dsd_jax.buckets import prefill_pieces
    t0 = time.perf_counter()
    engine = dsd.SpecEngine(target, draft, spec, max_batch_size=len(prompts), max_seq_len=max_seq_len,
                            batch_buckets=(len(prompts),), prefill_chunk=64, tokenizer=tokenizer, backend=backend)
    b = len(prompts)
    chunks = {c for _, c in prefill_pieces(max(map(len, prompts)), engine.programs.prefill_chunks)}
    precompiled = precompile(engine, [("step", engine.max_k, b)] + [("prefill", b, c) for c in sorted(chunks)]
                             + [("admit", b)] + [(f, m) for m in engine.programs.move_rows for f in ("slot_rows", "move")],
                             s.compile_threads)
    progress(f"e2e {label}: engine built, {precompiled}: {time.perf_counter() - t0:.1f} s")
    return engine, precompiled


def _generate_both(target, draft, prompts, s: Settings, backends, max_seq_len: int,
                   tokenizer=None) -> dict:
    """Greedy and sampled generation with each backend; tokens compared with the first's."""
    import dsd_jax as dsd
    out: dict[str, Any] = {"prompts": len(prompts), "max_tokens": s.e2e_max_tokens, "k": s.e2e_k}
    tokens: dict[str, dict] = {}
    for backend in backends:
        engine, precompiled = _compiled_engine(backend, target, draft, dsd.SpecConfig(num_speculative_tokens=s.e2e_k),
                                               prompts, s, max_seq_len, tokenizer, backend)
        runs = {}
        for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
            params = [dsd.SamplingParams(temperature=temp, max_tokens=s.e2e_max_tokens, seed=i, ignore_eos=True)
                      for i in range(len(prompts))]
            t0 = time.perf_counter()
            first = engine.generate(prompts, params)  # compiles what it needs
            engine.reset_prefix_cache()  # as cold as the first: nothing kept from it is reused
            t1 = time.perf_counter()
            again = engine.generate(prompts, params)
            t2 = time.perf_counter()
            runs[name] = [o.token_ids for o in again]
            out.setdefault(backend, {})[name] = {
                "first_call_s": round(t1 - t0, 3), "second_call_s": round(t2 - t1, 3),
                "tokens": sum(len(o.token_ids) for o in again),
                "deterministic": [o.token_ids for o in first] == runs[name]}
            progress(f"e2e {backend} {name}: {t1 - t0:.1f} s, then {t2 - t1:.1f} s")
        out[backend]["kernel_backends"] = engine.kernel_backends
        out[backend]["precompiled"] = precompiled
        out[backend]["mean_accepted_len"] = _mean_accepted(engine)
        tokens[backend] = runs
        del engine
        gc.collect()
    ref = tokens[backends[0]]
    for backend in backends[1:]:
        for name in ref:
            a, b = ref[name], tokens[backend][name]
            out.setdefault("identical", {})[f"{backend}/{name}"] = a == b
            if a != b:
                out.setdefault("first_divergence", {})[f"{backend}/{name}"] = _first_divergence(a, b)
    out["tokens_identical"] = all(out.get("identical", {}).values())
    out["tokens"] = tokens
    return out


def _first_divergence(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per completion, the first index where two token lists differ (None: identical)."""
    return [first_divergence(r, t) for r, t in zip(a, b)]


def spec_vs_plain(target, draft, prompts, s: Settings, max_seq_len: int, tokenizer=None) -> dict:
    """Greedy tokens of the speculative engine (K = `s.e2e_k`, backend "auto") against plain
    decoding (method "none"), on this device at the default matmul precision: what a user's
    own float32 engine gives (the demo builds its engines at "highest"). The two run
    different shapes (K + 1 tokens a row against 1), which a GPU may sum in another order,
    in TF32: a divergence reports the target's top-2 gap there."""
    import dsd_jax as dsd
    sp = dsd.SamplingParams(temperature=0.0, max_tokens=s.e2e_max_tokens, ignore_eos=True)
    plain, _ = _compiled_engine("plain, default precision", target, None, dsd.SpecConfig(method="none"),
                                prompts, s, max_seq_len, tokenizer)
    want = [o.token_ids for o in plain.generate(prompts, sp)]
    del plain
    spec, _ = _compiled_engine("speculative, default precision", target, draft,
                               dsd.SpecConfig(num_speculative_tokens=s.e2e_k), prompts, s, max_seq_len, tokenizer)
    t0 = time.perf_counter()
    got = [o.token_ids for o in spec.generate(prompts, sp)]
    progress(f"e2e speculative greedy at the default precision: {time.perf_counter() - t0:.1f} s")
    out = {"k": s.e2e_k, "kernel_backends": spec.kernel_backends, "identical": got == want,
           "matmul_precision": str(spec.programs.matmul_precision or "default")}  # what it compiled at
    del spec
    if got != want:
        div = _first_divergence(want, got)
        out["first_divergence"] = div
        out["top2_gap"] = _guard(_divergence_gap, target, prompts, want, div, target.config.dtype)
    gc.collect()
    return out


def _mean_accepted(engine) -> float | None:
    try:
        m = engine.metrics()
        return m.get("mean_accepted_len")
    except Exception:  # noqa: BLE001
        return None


def _divergence_gap(target, prompts, tokens, div, dtype: str) -> dict:
    """At the first greedy divergence (`div`, per completion: `_first_divergence`), the
    target's top-2 logit gap after `tokens` (the reference run's completions; XLA, full
    forward): a gap within the rounding of `dtype` (`NEAR_TIE`) means a near-tie, not a bug."""
    i = next(j for j, d in enumerate(div) if d is not None)
    return {"request": i, "position": div[i], **top2_gap_at(target, prompts[i], tokens[i], div[i], dtype)}


def e2e_builtin(s: Settings, deadline: float | None = None) -> dict:
    """The built-in pair: XLA against `s.backend` at precision "highest", then (unless
    `deadline` has passed) speculative against plain greedy at the default precision."""
    from dsd_jax import models
    progress("e2e builtin pair ...")
    t0 = time.perf_counter()
    target, draft, tok = models.builtin(dtype="float32")
    progress(f"e2e builtin pair loaded: {time.perf_counter() - t0:.1f} s")
    prompts = [tok.encode(p).ids[-48:] for p in models.heldout_prompts(s.e2e_batch)]
    # both backends exact float32 (XLA on a GPU would run f32 dots in TF32, the kernel does not)
    max_seq_len = 48 + s.e2e_max_tokens + 8
    with jax.default_matmul_precision("highest"):
        res = _generate_both(target, draft, prompts, s, ("xla", s.backend), max_seq_len, tok)
    res["spec_vs_plain"] = _unless_expired(deadline, spec_vs_plain, target, draft, prompts, s, max_seq_len, tok)
    return {"pair": "builtin (float32, matmul precision highest)", **res}


def e2e_synthetic(s: Settings) -> dict:
    from dsd_jax.models import synthetic
    t_name, d_name = s.e2e_pair
    progress(f"e2e synthetic pair {t_name} + {d_name} ...")
    target = synthetic(t_name, dtype=s.e2e_dtype, seed=0)
    draft = synthetic(d_name, dtype=s.e2e_dtype, seed=1)
    prompts = _random_prompts(target.config.vocab_size, s.e2e_batch, s.e2e_prompt_len)
    # float32 at precision highest, as the built-in pair: identical tokens are then a fair
    # demand (in bfloat16 the kernel and XLA round the softmax weights differently, and a
    # random 8B has many near-ties); the timings and the profile are bfloat16
    precision = "highest" if s.e2e_dtype == "float32" else jax.config.jax_default_matmul_precision
    with jax.default_matmul_precision(precision):
        res = _generate_both(target, draft, prompts, s, ("xla", s.backend),
                             s.e2e_prompt_len + s.e2e_max_tokens + 8)
        div = (res.get("first_divergence") or {}).get(f"{s.backend}/greedy")
        if div:
            res["greedy_divergence_top2_gap"] = _guard(_divergence_gap, target, prompts,
                                                       res["tokens"]["xla"]["greedy"], div, s.e2e_dtype)
    del target, draft
    gc.collect()
    suffix = ", matmul precision highest" if s.e2e_dtype == "float32" else ""
    return {"pair": f"{t_name} + {d_name} ({s.e2e_dtype}{suffix}, random weights)", **res}


def end_to_end(s: Settings, deadline: float | None = None,
               checkpoint: Callable[[dict], None] = lambda partial: None) -> dict:
    """Both pairs (the built-in one unless `s.builtin` is off); `checkpoint` gets the results
    so far after each, so a call killed during the second keeps the first."""
    out = {}
    if s.builtin:
        out["builtin"] = _unless_expired(deadline, e2e_builtin, s, deadline)
        checkpoint(dict(out))
    out["synthetic"] = _unless_expired(deadline, e2e_synthetic, s)
    compared = [r for r in out.values() if "skipped" not in r]
    out["tokens_identical"] = bool(compared) and all(r.get("tokens_identical") is True for r in compared)
    return out
