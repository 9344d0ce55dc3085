"""Kernels behind one dispatch: pure-XLA references on CPU, Pallas on GPU/TPU.

`backend` is "auto" (Pallas on GPU/TPU, XLA elsewhere), "xla", "pallas" or
"interpret" (the Pallas code run by the interpreter, for CPU tests). Models and
step programs call kernels only through these functions.
"""

from __future__ import annotations

import jax

from .attention_ref import verify_attention_xla

BACKENDS = ("auto", "xla", "pallas", "interpret")


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "pallas" if jax.default_backend() in ("gpu", "tpu") else "xla"
    return backend


def verify_attention(q, k_cache, v_cache, q_positions, *, backend: str = "auto"):
    """See `attention_ref.verify_attention_xla` for shapes and semantics."""
    backend = resolve_backend(backend)
    if backend == "xla":
        return verify_attention_xla(q, k_cache, v_cache, q_positions)
    from . import attention_pallas
    return attention_pallas.verify_attention(q, k_cache, v_cache, q_positions,
                                             interpret=backend == "interpret")


__all__ = ["BACKENDS", "resolve_backend", "verify_attention", "verify_attention_xla"]
