"""Validate and time everything on one accelerator: `python benchmarks/device_check.py --out DIR`.

Four sections, each writing into DIR/device_check.json (rewritten whole after every section,
so a run cut short keeps what it finished; a NaN or infinite number is written as null) and
DIR/device_check.txt (the report). A DIR holding an earlier run's outputs is refused unless
``--overwrite``; every flag is checked before anything runs; the exit status is 1 when
anything failed (`failures`), after everything is written:

- ``kernels``: the Pallas kernels (backend "pallas", not interpret) against their XLA
  references on the same device, with the cases and tolerances of `tests/test_kernels.py`
  (attention: max relative error < 1e-5 f32 / 1e-2 bf16, NaN exactly where the reference
  has it; rejection sampling: identical tokens and counts).
- ``timings``: each kernel against XLA at the Llama-3.1-8B, Qwen2.5-7B and Qwen3-8B shapes,
  with the roofline of `kernels/ROOFLINE.md` beside it (bytes, FLOPs, floor time at the
  device's HBM bandwidth, achieved GB/s and the fraction of the floor).
- ``e2e``: the engine on the built-in pair and on a synthetic real-shape pair
  (`models.synthetic`), greedy and sampled, with the XLA backend and the Pallas one: the
  tokens must be identical.
- ``profile``: the ITL(B, K) profile of the synthetic pair (`profile_engine`, backend
  "auto" with its per-kernel fallback), the acceptance given (the vLLM dynamic-SD PR's
  a_i), and the K schedule the goodput rule derives from it, beside the PR's H100 one; then
  the target's plain (K = 0) step and the draft's cost per draft token against their floors:
  each model's weight roofline and a bare jitted forward of it, and the drafter's own share
  of a step (the step against a verify-only one, `floor.py`).

``--time-budget S`` keeps the whole run within about S seconds, so that one call of a lent
machine's limited time always returns a report: a section, or an item inside one (a kernel
case, a timing point, an e2e pair, a profile row), starts only while its share of the time is
left; what was cut says "skipped (time budget)". Each section may use a share of the time
left when it starts (`SECTION_WEIGHTS`): the kernel checks all of it, then timings, e2e and
the profile 3 : 3 : 4 (time a section leaves unused passes to the next). The profile compiles
and times its batch sizes in the order given (`Settings.profile_buckets`), so a cut profile
keeps the first ones. A run may overshoot S by its longest item: an e2e pair, or the programs
being compiled when time ran out.

``--cpu-smoke`` runs the same code on tiny shapes in interpret mode on the CPU (the test
suite runs it). Everything is in small functions so the tests and other tools can call
each piece.
"""

from __future__ import annotations

from dsd_jax.divergence import NEAR_TIE, top2_gap

from .settings import (
    ATTN_CASES, BF16, F32, FLOOR_RESERVE_S, PROFILE_COMPILE_SHARE, PROFILE_RESERVE_S, REJ_CASES,
    SECTION_WEIGHTS, SECTIONS, SKIPPED, TIMING_MODELS, TOL, VLLM_ACCEPTANCE, VLLM_H100_SCHEDULE, Settings, device_info,
    hardware_peaks)
from .kernel_checks import (
    attention_case, cache_rows, check_kernels, query_positions, rejection_case, rejection_inputs)
from .timings import (
    attention_roofline, chained_calls, rejection_chain_step, rejection_roofline, time_attention,
    time_chain, time_kernels, time_rejection)
from .compile import precompile, precompile_steps
from .e2e import _divergence_gap, e2e_builtin, e2e_synthetic, end_to_end
from .floor import (
    ZeroDrafts, bare_loop, bare_step, draft_share_point, floor_point, format_floor, kv_bytes, kernel_launches,
    fused_projections, time_bare_forwards, weight_bytes)
from .profile import (
    bucket_order, controller_schedule, k_schedule, profile_pair, profile_with_acceptance,
    schedule_ranges)
from .report import format_report, write_results
from .command import build_parser, failures, main, run, section_deadline

__all__ = [
    "ATTN_CASES", "BF16", "F32", "FLOOR_RESERVE_S", "PROFILE_COMPILE_SHARE", "PROFILE_RESERVE_S",
    "REJ_CASES", "SECTION_WEIGHTS", "SECTIONS", "SKIPPED", "TIMING_MODELS", "TOL", "VLLM_ACCEPTANCE",
    "VLLM_H100_SCHEDULE", "Settings", "device_info", "hardware_peaks", "attention_case", "cache_rows",
    "check_kernels", "query_positions", "rejection_case", "rejection_inputs", "attention_roofline",
    "chained_calls", "rejection_chain_step", "rejection_roofline", "time_attention", "time_chain",
    "time_kernels", "time_rejection", "precompile", "precompile_steps", "NEAR_TIE", "top2_gap",
    "_divergence_gap", "e2e_builtin", "e2e_synthetic", "end_to_end", "bucket_order",
    "ZeroDrafts", "bare_loop", "bare_step", "draft_share_point", "floor_point", "kernel_launches",
    "format_floor", "kv_bytes", "fused_projections", "time_bare_forwards", "weight_bytes",
    "controller_schedule", "k_schedule", "profile_pair", "profile_with_acceptance", "schedule_ranges",
    "format_report", "write_results", "build_parser", "failures", "main", "run", "section_deadline"
]
