"""Kernels behind one dispatch: pure-XLA references, and Pallas kernels for GPU and TPU.

`backend` is "auto" (per kernel and platform, `AUTO`: Pallas attention on GPU/TPU, Pallas
rejection sampling on TPU, XLA elsewhere), "xla", "pallas" or
"interpret" (the Pallas code run by the interpreter, for CPU tests), or a
`KernelBackends` naming one per kernel (an engine passes one after resolving "auto" and
falling back, kernel by kernel, to XLA where a Pallas kernel did not compile). `platform`
("gpu" | "tpu" | None) picks the Pallas variant; None means the default backend,
or the TPU variant when interpreting on a CPU host. Models and step programs call
kernels only through these functions.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .attention_ref import verify_attention_xla
from .cache_attention import attend_and_write_xla, write_entries
from .rejection_ref import coupled_accept_xla, first_rejection, rejection_sample_xla

BACKENDS = ("auto", "xla", "pallas", "interpret")
KERNELS = ("attention", "rejection")  # attention: verify_attention / attend_and_write


class KernelBackends(NamedTuple):
    """The resolved backend ("xla" | "pallas" | "interpret") of each kernel. Hashable, so
    it goes wherever a backend string goes (static step options, drafters)."""

    attention: str
    rejection: str


class PallasFallbackWarning(RuntimeWarning):
    """A Pallas kernel failed to compile under backend="auto"; the engine uses XLA for it."""


# What "auto" runs, by platform. On an H200 (benchmarks/results/h200 and h200/run2, jax 0.11.2)
# the Pallas attention beat XLA's blocked loop 3-13x at every 8B shape, but the Pallas
# rejection sampler ran at 0.45-1.02x XLA's speed in both runs, so GPU samples with XLA unless
# asked for "pallas". The sampler has been reworked since (two Triton calls, no XLA ops
# around them): time it again (`benchmarks/results/README.md`, "On a GPU"). TPU is not
# measured yet: Pallas for both.
AUTO = {"gpu": KernelBackends(attention="pallas", rejection="xla"),
        "tpu": KernelBackends(attention="pallas", rejection="pallas")}


def default_platform(device=None) -> str:
    """The platform "auto" resolves against ("cpu" | "gpu" | "tpu"): `device`'s (an engine
    passes the device its programs run on, which `jax.default_device` may have made a CPU
    beside a GPU), else the default backend's; tests patch it."""
    return jax.default_backend() if device is None else device.platform


def resolve_backend(backend, kernel: str | None = None, platform: str | None = None) -> str:
    """The backend `kernel` (one of KERNELS) runs on: "auto" is `AUTO`'s entry for
    `platform` (None: `default_platform()`; XLA where it has none); a `KernelBackends`
    gives that kernel's entry, resolved the same way (an "auto" entry is `AUTO`'s; only the
    string "auto" lets an engine fall back to XLA)."""
    if isinstance(backend, KernelBackends) or backend == "auto":
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if isinstance(backend, KernelBackends):
        entry = getattr(backend, kernel)
        if entry not in BACKENDS:  # a typo would otherwise run the Pallas path
            raise ValueError(f"KernelBackends.{kernel} must be one of {BACKENDS}, got {entry!r}")
        backend = entry
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        auto = AUTO.get(platform or default_platform())
        return "xla" if auto is None else getattr(auto, kernel)
    return backend


def resolve_backends(backend, platform: str | None = None) -> KernelBackends:
    """Every kernel's backend for a backend string or a `KernelBackends`, "auto" resolved
    for `platform` (None: `default_platform()`)."""
    return KernelBackends(*(resolve_backend(backend, k, platform) for k in KERNELS))


def verify_attention(q, k_cache, v_cache, q_positions, rows=None, *, backend: str = "auto",
                     platform: str | None = None):
    """See `attention_ref.verify_attention_xla` for shapes and semantics."""
    backend = resolve_backend(backend, "attention")
    if backend == "xla":
        return verify_attention_xla(q, k_cache, v_cache, q_positions, rows)
    from . import attention_pallas
    return attention_pallas.verify_attention(q, k_cache, v_cache, q_positions, rows,
                                             interpret=backend == "interpret", platform=platform)


def _model_axis() -> int:
    """Size of the "model" axis of the mesh being traced under (`jax.set_mesh`); 1 without."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else dict(mesh.shape).get("model", 1)


def _per_device(fn, in_specs, out_specs):
    """`fn` once per device of the context mesh: GSPMD cannot partition a Pallas call (a
    custom call), so the kernels run under `shard_map` on their local shards, with no
    collectives inside."""
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def attend_and_write(q, k_new, v_new, positions, k_cache, v_cache, rows=None, *,
                     backend: str = "auto", platform: str | None = None):
    """Writes the new entries into the cache and attends over each row's live context.

    q [B, T, Hq, D]; k_new, v_new [B, T, Hkv, D]; positions [B, T] int32 (< 0: padding,
    not written, its output is garbage the caller ignores); caches [N, Hkv, S, D], batch
    row b using cache row rows[b] (b when rows is None). Query (b, t) attends entries
    0..positions[b, t] of its row, the new ones included. Returns (out [B, T, Hq, D],
    k_cache, v_cache); the caches are updated in place (see `cache_attention`).
    """
    backend = resolve_backend(backend, "attention")
    if backend == "xla":
        return attend_and_write_xla(q, k_new, v_new, positions, k_cache, v_cache, rows)
    idx = jnp.arange(q.shape[0], dtype=jnp.int32) if rows is None else rows

    def scatter_then_attend(q, k_new, v_new, positions, k_cache, v_cache, idx):
        k_cache = write_entries(k_cache, k_new, idx, positions)
        v_cache = write_entries(v_cache, v_new, idx, positions)
        out = verify_attention(q, k_cache, v_cache, jnp.maximum(positions, 0),
                               None if rows is None else idx, backend=backend, platform=platform)
        return out, k_cache, v_cache

    m = _model_axis()
    if m == 1:
        return scatter_then_attend(q, k_new, v_new, positions, k_cache, v_cache, idx)
    # Heads local when the KV heads split over "model" (as `dsd_jax.sharding` lays out the
    # cache); otherwise the cache is replicated and every device attends over all heads.
    heads = "model" if k_cache.shape[1] % m == 0 else None
    per_head, per_cache, rep = P(None, None, heads, None), P(None, heads, None, None), P()
    return _per_device(scatter_then_attend,
                       (per_head, per_head, per_head, rep, per_cache, per_cache, rep),
                       (per_head, per_cache, per_cache))(q, k_new, v_new, positions, k_cache,
                                                         v_cache, idx)


def rejection_sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise, *,
                     backend: str = "auto", platform: str | None = None):
    """See `rejection_ref.rejection_sample_xla` for shapes and semantics."""
    backend = resolve_backend(backend, "rejection")
    if backend == "xla":
        return rejection_sample_xla(target_probs, draft_probs, draft_tokens, uniforms, residual_noise)
    from . import rejection_pallas

    def sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise):
        return rejection_pallas.rejection_sample(target_probs, draft_probs, draft_tokens, uniforms,
                                                 residual_noise, interpret=backend == "interpret",
                                                 platform=platform)

    if _model_axis() == 1:
        return sample(target_probs, draft_probs, draft_tokens, uniforms, residual_noise)
    # replicated: every device samples the same tokens from the same (gathered) inputs
    return _per_device(sample, P(), P())(target_probs, draft_probs, draft_tokens, uniforms,
                                         residual_noise)


__all__ = ["AUTO", "BACKENDS", "KERNELS", "KernelBackends", "PallasFallbackWarning",
           "default_platform", "resolve_backend", "resolve_backends", "verify_attention", "verify_attention_xla",
           "attend_and_write", "attend_and_write_xla", "write_entries",
           "rejection_sample", "rejection_sample_xla", "coupled_accept_xla", "first_rejection"]
