"""What a device check covers: the cases, shapes and shares of the time budget (`Settings`),
the device's peaks, and the guards every section runs its items under."""

from __future__ import annotations

import dataclasses
import platform as _platform
import sys
import time
import traceback
from typing import Callable, Sequence

import jax
import jax.numpy as jnp


SECTIONS = ("kernels", "timings", "e2e", "profile")
F32, BF16 = jnp.float32, jnp.bfloat16
TOL = {"float32": 1e-5, "bfloat16": 1e-2}

# Acceptance a_i = P(accepted >= i) published with vLLM's dynamic speculative decoding PR,
# and the K schedule that PR profiled on an H100 (for the report's comparison).
VLLM_ACCEPTANCE = (0.681, 0.391, 0.204, 0.101, 0.051)
VLLM_H100_SCHEDULE = "K*=3 up to B~16-64, K*=1 around B~64-128, K*=0 at B=256"

# Peak HBM bandwidth (bytes/s) and dense bf16 FLOP/s by exact `device_kind` (the CUDA device
# name), from NVIDIA's data sheets (the H100 SXM's as in ROOFLINE.md). Matched exactly, not
# by substring: "NVIDIA H100 NVL" (3.9 TB/s), "NVIDIA GH200 480GB" (HBM3 or HBM3e) and
# "NVIDIA H200 NVL" had taken an H100 SXM's or an H200's peaks. A kind not listed has no
# peaks: the report shows no floors, rather than wrong ones.
_HARDWARE = {
    "NVIDIA H200": (4.8e12, 990e12),             # H200 SXM 141 GB data sheet (1979 TFLOP/s sparse)
    "NVIDIA H100 80GB HBM3": (3.35e12, 990e12),  # H100 SXM5 data sheet (1979 TFLOP/s sparse)
    "NVIDIA H100 PCIe": (2.0e12, 756e12),        # H100 PCIe 80 GB data sheet (1513 TFLOP/s sparse)
    "NVIDIA A100-SXM4-80GB": (2.039e12, 312e12),  # A100 data sheet: 80 GB SXM 2039 GB/s
    "NVIDIA A100 80GB PCIe": (1.935e12, 312e12),  # 80 GB PCIe 1935 GB/s
    "NVIDIA A100-SXM4-40GB": (1.555e12, 312e12),  # 40 GB 1555 GB/s
    "NVIDIA A100-PCIE-40GB": (1.555e12, 312e12),  # 40 GB PCIe 1555 GB/s
}

# Shares of the time left under --time-budget that a section may use when it starts, among
# the sections still to run (None: all of it; the kernel checks come first and are short).
SECTION_WEIGHTS = {"kernels": None, "timings": 3, "e2e": 3, "profile": 4}
PROFILE_COMPILE_SHARE = 0.6  # of the profile's time, at most, for compiling its step programs
# seconds the profile keeps after its last row: the pair's fingerprints (a hash of every
# weight, ~18 s for 8B + 1B), the draft's catch-up timing and the file
PROFILE_RESERVE_S = 40.0
# seconds kept after that for the floors (`floor.py`: a bare forward of the target and of the
# draft compiled and timed per batch size of `floor_batch_sizes`, and where that size was
# profiled a verify-only step (the 8B + 1B step compiled in ~9 s on the H200); past the
# deadline the rest is skipped, so at most one compile overshoots it). 100: each size now
# also compiles the forward with fused projections (`floor.fused_projections`)
FLOOR_RESERVE_S = 100.0

# Correctness cases: the GPU cases of tests/test_kernels.py (tests/test_device_check.py keeps
# them equal). (B, T, Hq, Hkv, S, D, dtype, block_k, num_splits, row kinds)
ATTN_CASES = [
    (3, 1, 4, 4, 40, 64, "float32", None, None, ("one", "full", "odd")),
    (4, 5, 28, 4, 200, 128, "float32", 64, 3, ("odd", "one", "full", "pad")),
    (3, 9, 16, 2, 77, 128, "bfloat16", 32, 2, ("full", "odd", "neg")),
    (3, 3, 8, 4, 50, 64, "bfloat16", 16, None, ("pad", "one", "odd")),
    (2, 2, 32, 8, 129, 64, "float32", 32, 4, ("odd", "full")),
    (2, 40, 16, 4, 300, 128, "bfloat16", None, None, ("full", "odd")),
]
# (B, K, V, one-hot q, greedy rows, p == q rows, block_v, GPU splits)
REJ_CASES = [
    (6, 4, 1000, False, (1,), (2,), 256, 3),
    (6, 3, 700, True, (0, 4), (), 128, 2),
    (3, 8, 520, False, (), (1,), 128, None),
    (2, 1, 151936, False, (1,), (), None, None),
]
# name: (Hq, Hkv, head_dim, vocab), as in tests/test_kernels.py
TIMING_MODELS = {
    "llama-3.1-8b": (32, 8, 128, 128256),
    "qwen2.5-7b": (28, 4, 128, 152064),
    "qwen3-8b": (32, 8, 128, 151936),
}


@dataclasses.dataclass
class Settings:
    """What a run covers; `gpu()` is the real run, `cpu_smoke()` the tiny interpret one."""

    backend: str = "pallas"  # the Pallas backend checked against "xla"
    attn_cases: Sequence = tuple(ATTN_CASES)
    rej_cases: Sequence = tuple(REJ_CASES)
    timing_models: dict = dataclasses.field(default_factory=lambda: dict(TIMING_MODELS))
    # (B, T, live L) per model; the first model gets `attn_points`, the others `attn_points_short`
    attn_points: Sequence = ((1, 5, 2048), (8, 1, 2048), (8, 5, 2048), (8, 5, 512), (32, 5, 4096),
                             (64, 5, 2048))
    attn_points_short: Sequence = ((1, 5, 2048), (8, 5, 2048), (64, 5, 2048))
    # (B, K, one-hot q)
    rej_points: Sequence = ((1, 4, False), (8, 4, False), (8, 4, True), (64, 4, False), (64, 4, True))
    rej_points_short: Sequence = ((1, 4, False), (8, 4, False), (64, 4, False))
    # the GPU sampler also at these multiples of its default vocab splits (`gpu_config`), at
    # the first model's points
    rej_split_factors: Sequence = (4, 16)
    timing_reps: int = 7
    chain: int = 10  # kernel calls per timed program (one dispatch amortised over them)
    dtype: str = "bfloat16"  # timings and the synthetic pairs
    builtin: bool = True  # e2e on the built-in pair too
    e2e_pair: tuple = ("llama-3.1-8b", "llama-3.2-1b")
    e2e_batch: int = 4
    e2e_prompt_len: int = 32
    e2e_max_tokens: int = 32
    e2e_k: int = 3
    e2e_dtype: str = "float32"  # the synthetic e2e pair (8B + 1B: 37 GB, fits an H100)
    profile_pair: tuple = ("llama-3.1-8b", "llama-3.2-1b")
    # the profile's batch buckets, in the order they are compiled and timed: a profile cut
    # by the time budget keeps the first (the ends of the range, then its middle)
    profile_buckets: Sequence = (1, 256, 64, 16, 128, 32)
    profile_contexts: Sequence = (128, 512)
    profile_max_k: int = 4
    profile_max_seq_len: int | None = None  # None: the longest context + 64
    compile_threads: int = 8  # step programs compiled in parallel before the profile
    profile_repeats: int = 5
    profile_warmup_reps: int = 2
    acceptance: Sequence = VLLM_ACCEPTANCE
    # the target's K = 0 step and the draft's cost per token against their floors (`floor.py`).
    # 1 and 2: on the H200 a K = 0 step at B = 1 (one-row matmuls) took longer than K = 1 (two
    # rows) and than K = 0 at B = 16
    floor_batch_sizes: Sequence = (1, 2, 16)

    @classmethod
    def gpu(cls, **kw) -> "Settings":
        return cls(**kw)

    @classmethod
    def cpu_smoke(cls, **kw) -> "Settings":
        base = dict(
            backend="interpret", attn_cases=(ATTN_CASES[0], ATTN_CASES[2]),
            rej_cases=(REJ_CASES[1],), timing_models={"tiny-llama": (4, 2, 16, 512)},
            attn_points=((2, 3, 40),), attn_points_short=(), rej_points=((2, 2, False),),
            rej_points_short=(), timing_reps=2, chain=2, builtin=False,
            e2e_pair=("tiny-llama", "tiny-llama-draft"), e2e_batch=2, e2e_prompt_len=8,
            e2e_max_tokens=6, e2e_k=1, e2e_dtype="bfloat16", profile_pair=("tiny-llama", "tiny-llama-draft"),
            profile_buckets=(2,), profile_contexts=(16,), profile_max_k=1,
            profile_repeats=1, profile_warmup_reps=0, floor_batch_sizes=(2,))
        base.update(kw)
        # 22: the e2e XLA engine's shapes, so its step program is the profile's (a compilation
        # cache, as the test suite has, compiles it once); longer contexts need more (a pinned
        # 22 had failed the profile of --profile-contexts 64 only when it ran)
        base.setdefault("profile_max_seq_len", max(22, max(base["profile_contexts"], default=0) + 6))
        return cls(**base)


def device_info() -> dict:
    dev = jax.devices()[0]
    info = {"device_kind": dev.device_kind, "platform": dev.platform, "num_devices": jax.device_count(),
            "jax": jax.__version__, "python": _platform.python_version()}
    try:
        import flax
        info["flax"] = flax.__version__
    except Exception:  # noqa: BLE001
        pass
    # None for a kind not in _HARDWARE: unknown, and the report says so (no floors)
    info["hbm_bytes_per_s"], info["bf16_flops_per_s"] = hardware_peaks(dev.device_kind) or (None, None)
    return info


def hardware_peaks(device_kind: str) -> tuple[float, float] | None:
    """(HBM bytes/s, dense bf16 FLOP/s) of a known device kind (its exact name), else None."""
    return _HARDWARE.get(device_kind.strip())


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


SKIPPED = "time budget"


def progress(message: str) -> None:
    """A progress line inside a section, on stderr at once: a run its call's timeout kills
    still shows where its time went (the JSON is written only after each section)."""
    print(f"device_check:   {message}", file=sys.stderr, flush=True)


def _unless_expired(deadline: float | None, fn: Callable, *args, **kw) -> dict:
    """`_guard(fn, ...)`, or {"skipped": "time budget"} once `deadline` has passed."""
    return {"skipped": SKIPPED} if _expired(deadline) else _guard(fn, *args, **kw)


def _guard(fn: Callable, *args, **kw) -> dict:
    """fn(...) as a dict, or {"error": first line, "traceback": ...} when it raises."""
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001  (a device check reports, it does not stop)
        return {"error": _first_line(e), "traceback": traceback.format_exc(limit=8)}
