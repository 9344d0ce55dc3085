"""The ``e2e`` section: the engine with the XLA backend and the Pallas one must give the same tokens."""

from __future__ import annotations

import gc
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .compile import precompile
from .settings import Settings, _guard, _unless_expired


def _random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=length - i % 3).tolist() for i in range(n)]


def _generate_both(target, draft, prompts, s: Settings, backends, max_seq_len: int,
                   tokenizer=None) -> dict:
    """Greedy and sampled generation with each backend; tokens compared with the first's."""
    import dsd_jax as dsd
    out: dict[str, Any] = {"prompts": len(prompts), "max_tokens": s.e2e_max_tokens, "k": s.e2e_k}
    tokens: dict[str, dict] = {}
    for backend in backends:
        engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=s.e2e_k),
                                max_batch_size=len(prompts), max_seq_len=max_seq_len,
                                batch_buckets=(len(prompts),), prefill_chunk=64,
                                tokenizer=tokenizer, backend=backend)
        # what generate compiles, compiled side by side first
        from dsd_jax.buckets import prefill_pieces
        b = len(prompts)
        chunks = {c for _, c in prefill_pieces(max(map(len, prompts)), engine.programs.prefill_chunks)}
        precompiled = precompile(engine, [("step", s.e2e_k, b)] + [("prefill", b, c) for c in sorted(chunks)]
                                 + [("admit", b), ("move",)], s.compile_threads)
        runs = {}
        for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
            params = [dsd.SamplingParams(temperature=temp, max_tokens=s.e2e_max_tokens, seed=i)
                      for i in range(len(prompts))]
            t0 = time.perf_counter()
            first = engine.generate(prompts, params)  # compiles what it needs
            t1 = time.perf_counter()
            again = engine.generate(prompts, params)
            t2 = time.perf_counter()
            runs[name] = [o.token_ids for o in again]
            out.setdefault(backend, {})[name] = {
                "first_call_s": round(t1 - t0, 3), "second_call_s": round(t2 - t1, 3),
                "tokens": sum(len(o.token_ids) for o in again),
                "deterministic": [o.token_ids for o in first] == runs[name]}
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
                out.setdefault("first_divergence", {})[f"{backend}/{name}"] = [
                    next((i for i, (x, y) in enumerate(zip(r, t)) if x != y), min(len(r), len(t)))
                    if r != t else None for r, t in zip(a, b)]
    out["tokens_identical"] = all(out.get("identical", {}).values())
    out["tokens"] = tokens
    return out


def _mean_accepted(engine) -> float | None:
    try:
        m = engine.metrics()
        return m.get("mean_accepted_len")
    except Exception:  # noqa: BLE001
        return None


NEAR_TIE_ULPS = 4  # a greedy divergence at a top-2 gap within this many bf16 ulps is a near-tie


def _divergence_gap(target, prompts, res, div, s: Settings) -> dict:
    """At the first greedy divergence, the target's top-2 logit gap (XLA, full forward): a
    gap within bf16 rounding means a near-tie, not a kernel bug."""
    from flax import nnx

    from dsd_jax import models
    i = next(j for j, d in enumerate(div) if d is not None)
    seq = list(prompts[i]) + res["tokens"]["xla"]["greedy"][i][:div[i]]
    n = len(seq)
    graph, params = nnx.split(target)
    cfg = target.config

    @jax.jit
    def last_logits(params, tokens):
        pos = jnp.arange(n, dtype=jnp.int32)[None]
        logits, _ = models.forward(graph, params, tokens[None], pos,
                                   models.init_kv_cache(cfg, 1, n), attn_backend="xla")
        return logits[0, -1]

    top = np.sort(np.asarray(last_logits(params, jnp.asarray(seq, jnp.int32)), np.float64))[-2:]
    gap = float(top[1] - top[0])
    # a bf16 ulp at the top logit's magnitude: two backends that round a long bf16 sum
    # differently can swap two logits this close (random weights make such near-ties common)
    ulp = 2.0 ** (np.floor(np.log2(max(abs(top[1]), 1e-30))) - 7)
    return {"request": i, "position": div[i], "top2_gap": gap, "top1_logit": float(top[1]),
            "gap_in_bf16_ulps": round(gap / ulp, 2), "near_tie": bool(gap <= NEAR_TIE_ULPS * ulp)}


def e2e_builtin(s: Settings) -> dict:
    from dsd_jax import models
    target, draft, tok = models.builtin(dtype="float32")
    prompts = [tok.encode(p).ids[-48:] for p in models.heldout_prompts(s.e2e_batch)]
    # both backends exact float32 (XLA on a GPU would run f32 dots in TF32, the kernel does not)
    with jax.default_matmul_precision("highest"):
        res = _generate_both(target, draft, prompts, s, ("xla", s.backend),
                             48 + s.e2e_max_tokens + 8, tok)
    return {"pair": "builtin (float32, matmul precision highest)", **res}


def e2e_synthetic(s: Settings) -> dict:
    from dsd_jax.models import synthetic
    t_name, d_name = s.e2e_pair
    target = synthetic(t_name, dtype=s.dtype, seed=0)
    draft = synthetic(d_name, dtype=s.dtype, seed=1)
    prompts = _random_prompts(target.config.vocab_size, s.e2e_batch, s.e2e_prompt_len)
    res = _generate_both(target, draft, prompts, s, ("xla", s.backend),
                         s.e2e_prompt_len + s.e2e_max_tokens + 8)
    div = (res.get("first_divergence") or {}).get(f"{s.backend}/greedy")
    if div:
        res["greedy_divergence_top2_gap"] = _guard(_divergence_gap, target, prompts, res, div, s)
    del target, draft
    gc.collect()
    return {"pair": f"{t_name} + {d_name} ({s.dtype}, random weights)", **res}


def end_to_end(s: Settings, deadline: float | None = None) -> dict:
    out = {}
    if s.builtin:
        out["builtin"] = _unless_expired(deadline, e2e_builtin, s)
    out["synthetic"] = _unless_expired(deadline, e2e_synthetic, s)
    compared = [r for r in out.values() if "skipped" not in r]
    out["tokens_identical"] = bool(compared) and all(r.get("tokens_identical") is True for r in compared)
    return out
