"""Kernels behind one dispatch: pure-XLA references on CPU, Pallas on GPU/TPU.

`backend` is "auto" (Pallas on GPU/TPU, XLA elsewhere), "xla", "pallas" or
"interpret" (the Pallas code run by the interpreter, for CPU tests). `platform`
("gpu" | "tpu" | None) picks the Pallas variant; None means the default backend,
or the TPU variant when interpreting on a CPU host. Models and step programs call
kernels only through these functions.
"""

from __future__ import annotations

import jax

from .attention_ref import verify_attention_xla
from .rejection_ref import coupled_accept_xla, first_rejection, rejection_sample_xla

BACKENDS = ("auto", "xla", "pallas", "interpret")


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "pallas" if jax.default_backend() in ("gpu", "tpu") else "xla"
    return backend


def verify_attention(q, k_cache, v_cache, q_positions, *, backend: str = "auto",
                     platform: str | None = None):
    """See `attention_ref.verify_attention_xla` for shapes and semantics."""
    backend = resolve_backend(backend)
    if backend == "xla":
        return verify_attention_xla(q, k_cache, v_cache, q_positions)
    from . import attention_pallas
    return attention_pallas.verify_attention(q, k_cache, v_cache, q_positions,
                                             interpret=backend == "interpret", platform=platform)


def rejection_sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise, *,
                     backend: str = "auto", platform: str | None = None):
    """See `rejection_ref.rejection_sample_xla` for shapes and semantics."""
    backend = resolve_backend(backend)
    if backend == "xla":
        return rejection_sample_xla(target_probs, draft_probs, draft_tokens, uniforms, residual_noise)
    from . import rejection_pallas
    return rejection_pallas.rejection_sample(target_probs, draft_probs, draft_tokens, uniforms,
                                             residual_noise, interpret=backend == "interpret",
                                             platform=platform)


__all__ = ["BACKENDS", "resolve_backend", "verify_attention", "verify_attention_xla",
           "rejection_sample", "rejection_sample_xla", "coupled_accept_xla", "first_rejection"]
