"""Where two greedy runs part, and whether rounding explains it.

Greedy speculative decoding emits the target's argmax, as plain decoding does, but its
verify runs K + 1 positions a row where plain decoding runs one: another program, whose
sums may round differently in the last bits. Where the target's top two logits lie that
close, the two runs may take different tokens, and from there different completions. Each
is the argmax of a correct forward, so such a divergence is rounding, not a wrong
acceptance. `bench_full_s27` met one: prompt 372 of the B=32 point, whose top-2 gap at
completion token 33 is one float32 ulp (4.8e-7 at a logit of 5.36), flipped under static K
in six shuffled row orders and not in the group's own (`benchmarks/results/near_tie/`).

`top2_gap_at` measures the gap by a fresh full forward; `top2_gap` says whether a gap is a
near-tie (`NEAR_TIE`). The bench and the device check diagnose every divergence with them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MANTISSA_BITS", "NEAR_TIE", "first_divergence", "top2_gap", "top2_gap_at"]

# A greedy divergence at a top-2 logit gap within this share of the top logit is a near-tie
# two programs' rounding can swap: 4 ulps in bfloat16 (a long bf16 sum rounded differently);
# 2^-13 (1024 ulps) in float32, where the programs differ only in summation order, amplified
# over the layers (random weights make such near-ties common).
NEAR_TIE = {"bfloat16": 4 * 2.0 ** -7, "float32": 2.0 ** -13}
MANTISSA_BITS = {"bfloat16": 7, "float32": 23}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length where one is
    a prefix of the other); None where they are identical."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def top2_gap(top1: float, top2: float, dtype: str) -> dict:
    """The gap between the top two logits, in ulps of `dtype` at the top logit, and whether
    rounding in `dtype` could swap them (`NEAR_TIE`)."""
    gap = float(top1 - top2)
    scale = 2.0 ** np.floor(np.log2(max(abs(top1), 1e-30)))  # the top logit's binade
    return {"top2_gap": gap, "top1_logit": float(top1), "dtype": dtype,
            "gap_in_ulps": round(gap / (scale * 2.0 ** -MANTISSA_BITS[dtype]), 2),
            "near_tie": bool(gap <= NEAR_TIE[dtype] * scale)}


def top2_gap_at(target, prompt: list[int], tokens: list[int], position: int, dtype: str | None = None) -> dict:
    """The target's top-2 logit gap where completion token `position` is chosen after
    `prompt` + `tokens[:position]` (`top2_gap`, in `dtype`, by default the target's), by a
    fresh full forward on the XLA path: neither run's program."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dsd_jax import models
    seq = list(prompt) + list(tokens[:position])
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
    return top2_gap(top[1], top[0], dtype or cfg.dtype)
