"""Lowering for a platform this host does not have (the CUDA checks run on CPU-only hosts).

jax <= 0.10: Pallas's Triton lowering, finding no GPU, targets compute capability 9.0 by
itself (`jax/_src/pallas/triton/pallas_call_registration.py`), so a plain
`jitted.trace(*args).lower(lowering_platforms=("cuda",))` works and is what runs there.

jax >= 0.11 (jax-ml/jax#38762): that lowering asks `get_gpu_info()`
(`jax/_src/pallas/triton/gpu_info.py`), which reads the device kind of the abstract device
of the context abstract mesh, else of the default device (here the CPU), and the lowering
raises RuntimeError("No supported GPU devices found, please specify an abstract GPU device
using AbstractDevice. ..."). The supported way to name a GPU that is not there is a
`jax.sharding.AbstractDevice` on the abstract mesh, set with `jax.sharding.use_abstract_mesh`
around both tracing and lowering: each traced equation keeps the abstract mesh it was traced
under and its lowering runs under that one again.
"""

from __future__ import annotations

import contextlib

import jax

# The GPU named where there is none: compute capability 9.0, the target jax <= 0.10 falls
# back to without a GPU, so the Triton modules are the ones lowered there.
ABSTRACT_GPU_KIND = "NVIDIA H100"
NO_GPU_ERROR = "No supported GPU devices found"


def _get_gpu_info():
    """Pallas Triton's target-GPU query (jax >= 0.11), or None where it does not exist."""
    try:
        from jax.experimental.pallas import triton as pl_triton
    except ImportError:
        return None
    return getattr(pl_triton, "get_gpu_info", None)


def target_device(platform: str):
    """A context under which Pallas Triton lowers for `platform`: a null one on jax <= 0.10,
    for other platforms, or where the context already names a supported GPU (a real default
    device or the caller's abstract one); otherwise the current abstract mesh with an abstract
    `ABSTRACT_GPU_KIND` device."""
    get_gpu_info = _get_gpu_info()
    if platform != "cuda" or get_gpu_info is None:
        return contextlib.nullcontext()
    try:
        get_gpu_info()
        return contextlib.nullcontext()
    except ValueError:  # "Unsupported GPU device kind: cpu": what makes the lowering fail
        pass
    device = jax.sharding.AbstractDevice(device_kind=ABSTRACT_GPU_KIND, num_cores=None,
                                         platform=platform)
    mesh = jax.sharding.get_abstract_mesh()
    mesh = (jax.sharding.AbstractMesh((), (), abstract_device=device) if mesh.empty
            else mesh.update(abstract_device=device))
    return jax.sharding.use_abstract_mesh(mesh)


def lower_for(platform: str, jitted, *args):
    """`jitted.trace(*args).lower(lowering_platforms=(platform,))` (a `jax.stages.Lowered`),
    with the GPU named where this jax needs one and the host has none (see the module doc)."""
    ctx = target_device(platform)
    with ctx:
        try:
            return jitted.trace(*args).lower(lowering_platforms=(platform,))
        except RuntimeError as e:
            if NO_GPU_ERROR in str(e) and not isinstance(ctx, contextlib.nullcontext):
                e.add_note(f"lowered for {platform} under {jax.sharding.get_abstract_mesh()}")
            raise
