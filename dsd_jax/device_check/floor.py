"""The plain step's floors and the draft's, beside the profile: how far a step is from the
least work it does.

Two floors per model and batch size B at the profile's shortest context:

* the roofline: the model's weights (and the context's KV entries) read once from HBM,
  which a decode step at small B cannot beat;
* a minimal program: the model's forward with none of the engine, a jitted loop of
  one-token steps (embedding, norms, the matmuls, RoPE, the LM head and a greedy pick;
  attention replaced by its queries, no KV cache, no slots, no sampling tail).

They stand beside what the profile measured (its raw cells, not the table made monotone in
K): for the target, the K = 0 step; for the draft, what one more draft token adds to a step
(ITL(K+1) - ITL(K) for K >= 1, the mean: one more verified token and its sampling included)
and, apart from that, the drafter's own share of a step: the step at the largest K against
the same step with zero drafts and no drafter (`draft_share_point`), timed interleaved.
(On a 2-core CPU the first read 0.48 ms a token and the second 0.17: a verified token
costs there what a draft token does, `benchmarks/results/h200/cpu_floor/`.)
A measurement far above the bare forward is the engine's own work (attention, cache writes,
bookkeeping); a bare forward far above the roofline is XLA's matmuls, or the launches of
many small kernels, at that batch size.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax.drafters.base import Drafter, Proposal

ROUNDS = 4  # one-token steps per timed call, as the profile's rounds_per_sample


def weight_bytes(model) -> int:
    """Bytes of parameters one forward reads: all of them but an untied embedding table, of
    which a lookup reads B rows."""
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))  # arrays or abstract shapes alike
    nbytes = lambda x: x.size * jnp.dtype(x.dtype).itemsize
    total = sum(nbytes(x) for x in jax.tree.leaves(params))
    if not model.config.tie_word_embeddings:
        total -= nbytes(params["embed"])
    return int(total)


def kv_bytes(config, batch: int, context: int) -> int:
    """Bytes of the KV entries `batch` rows of `context` tokens hold, in the model's dtype."""
    return int(batch * context * config.num_layers * 2 * config.num_kv_heads * config.head_dim
               * jnp.dtype(config.jnp_dtype).itemsize)


def bare_step(graphdef, params, tokens, fused=None):
    """One greedy one-token step of a split model, attention replaced by its queries:
    tokens [B] -> next tokens [B]. `fused` (`fused_projections`): each layer's projections
    that read one input run as one matmul (wq|wk|wv, then w_gate|w_up)."""
    from dsd_jax.models.transformer import rope_cos_sin
    model = nnx.merge(graphdef, params)
    cfg = model.config
    cos, sin = rope_cos_sin(cfg, jnp.zeros((tokens.shape[0], 1), jnp.int32))
    x = jnp.take(model.embed[...], tokens[:, None], axis=0)
    tiny = jnp.asarray(1e-30, x.dtype)
    for i, layer in enumerate(model.layers):
        wqkv, w_gate_up = (None, None) if fused is None else fused[i]
        q, k, v = layer.qkv(cfg, x, cos, sin, wqkv)
        # keys and values feed nothing without attention: their sums (B * Hkv * D elements, next
        # to nothing) keep their whole matmuls (a slice could be folded into a narrower dot)
        live = (jnp.sum(k) + jnp.sum(v)).astype(x.dtype)
        x = layer.finish(cfg, x, q + tiny * live, w_gate_up)
    return jnp.argmax(model.logits(x)[:, 0], axis=-1).astype(jnp.int32)


def fused_projections(model) -> list[tuple]:
    """Per layer, (wq|wk|wv, w_gate|w_up): the projections that read one input, concatenated
    along their outputs. On the H200 a bare forward cost 3.3-5.4 us a kernel beyond the
    roofline (launch-bound; `benchmarks/results/h200/run2/`): this is its variant with 3 of
    its about 14 kernels a layer fewer, timed beside it (`floor_point`)."""
    return [(jnp.concatenate([layer.wq[...], layer.wk[...], layer.wv[...]], axis=1),
             jnp.concatenate([layer.w_gate[...], layer.w_up[...]], axis=1)) for layer in model.layers]


# HLO instructions that launch nothing: plumbing, and the control flow whose bodies are counted
_NO_LAUNCH = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while", "conditional",
              "call", "opt-barrier", "after-all", "partition-id", "replica-id"}
_INSTR = re.compile(r"^\s*(?:ROOT )?%\S+ = .*? ([a-z][\w-]*)\(")
_HEAD = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")


def kernel_launches(hlo: str) -> int:
    """Kernels one run of an optimized HLO module (`compiled.as_text()`) launches, counted
    statically from its entry: each computation's instructions but plumbing and control flow,
    plus a loop's condition and body once (not per iteration), the largest branch of a
    conditional and a called computation (what a fusion, reduction or scatter calls runs
    inside one kernel). A decode step program counts one round (its rounds loop once), a bare
    loop one forward and its loop control; a loop inside a round (the draft's scan, the XLA
    attention path's blocks) counts once, so a step's count is a floor. On a GPU, kernels a
    command buffer (CUDA graph) groups count all the same."""
    bodies: dict[str, list[str]] = {}
    name, entry = None, None
    for line in hlo.splitlines():
        head = _HEAD.match(line)
        if head:
            name = head.group(1)
            bodies[name] = []
            entry = name if line.startswith("ENTRY") else entry
        elif name is not None and line.strip() and line.strip() != "}":
            bodies[name].append(line)

    @functools.lru_cache(maxsize=None)
    def count(comp: str) -> int:
        total = 0
        for line in bodies.get(comp, ()):
            m = _INSTR.match(line)
            if not m:
                continue
            if m.group(1) not in _NO_LAUNCH:
                total += 1
            total += sum(count(c) for c in re.findall(r"\b(?:body|condition)=%([\w.-]+)", line))
            if m.group(1) == "call":
                total += sum(count(c) for c in re.findall(r"\bto_apply=%([\w.-]+)", line))
            branches = re.findall(r"branch_computations=\{([^}]*)\}", line)
            branches = [b.strip().lstrip("%") for group in branches for b in group.split(",")]
            branches += re.findall(r"(?:true|false)_computation=%([\w.-]+)", line)
            total += max((count(b) for b in branches), default=0)
        return total
    return count(entry) if entry else 0


def bare_loop(model, fused: bool = False):
    """(jitted `loop(params, tokens)`: ROUNDS dependent `bare_step`s, params) of `model`;
    `fused`: the step with `fused_projections` (then params holds them too)."""
    graphdef, params = nnx.split(model)
    params = (params, fused_projections(model) if fused else None)

    @jax.jit
    def loop(params, tokens):
        state, projections = params
        return jax.lax.fori_loop(0, ROUNDS, lambda _, t: bare_step(graphdef, state, t, projections), tokens)

    return loop, params


def time_bare_forwards(model, batch: int, reps: int, variants=(False,)) -> list[tuple[float, int]]:
    """Per variant of `bare_loop` (`fused` False or True), (milliseconds per step of
    `bare_step` at `batch` rows: the median of `reps` timed calls, each a jitted loop of ROUNDS
    dependent steps (one compile whatever ROUNDS); the kernels one step launches,
    `kernel_launches` of the loop). The variants' calls are interleaved, rep by rep."""
    tokens = jnp.arange(batch, dtype=jnp.int32) % model.config.vocab_size
    runs = []
    for fused in variants:
        loop, params = bare_loop(model, fused)
        compiled = loop.lower(params, tokens).compile()
        jax.block_until_ready(compiled(params, tokens))  # warm
        runs.append((compiled, params, []))
    for _ in range(reps):
        for compiled, params, times in runs:
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(params, tokens))
            times.append(time.perf_counter() - t0)
    return [(1e3 * statistics.median(times) / ROUNDS, kernel_launches(compiled.as_text()))
            for compiled, _, times in runs]


def floor_point(model, role: str, batch: int, context: int, measured_ms: float | None, reps: int,
                bw: float | None) -> dict:
    """One model ("target" or "draft") at one batch size: what the profile measured
    (`measured_ms`, or None), the bare forward and the roofline, in milliseconds, with the
    ratios between them, and the kernels the bare forward launches (with the roofline: the
    microseconds each costs beyond it, which near a launch's 3-5 us says launch-bound)."""
    (bare, kernels), (fused, fused_kernels) = time_bare_forwards(model, batch, reps, (False, True))
    ideal = weight_bytes(model) + kv_bytes(model.config, batch, context)
    roof = None if not bw else 1e3 * ideal / bw
    out = {"role": role, "B": batch, "context": context, "measured_ms": measured_ms,
           "bare_forward_ms": bare, "roofline_ms": roof, "ideal_bytes": ideal, "bare_kernels": kernels,
           "fused_forward_ms": fused, "fused_kernels": fused_kernels}
    if measured_ms:
        out["measured_over_bare"] = measured_ms / bare
    if roof:
        out["bare_over_roofline"] = bare / roof
        out["us_per_kernel_over_roofline"] = 1e3 * (bare - roof) / kernels
        if measured_ms:
            out["measured_over_roofline"] = measured_ms / roof
    return out


def format_floor(rows) -> list[str]:
    """Report lines for `floor_point` rows (skipped or failed ones say so)."""
    lines = ["steps against their floors at the shortest context (measured: the target's K=0 step, "
             "the draft's cost per draft token; bare forward: the model's jitted one-token loop, no "
             "attention or cache; roofline: weights + KV / HBM)",
             "  model    B | measured ms | bare forward ms | roofline ms | measured/bare | bare/roofline | "
             "kernels: bare (step) | us a kernel over the roofline"]
    for r in rows:
        if "bare_forward_ms" not in r:
            lines.append(f"  {r.get('role', '?'):<6} {r.get('B', '?'):>3} | not run: "
                         f"{r.get('error') or r.get('skipped')}")
            continue
        f = lambda x, spec=".3f": "-" if x is None else format(x, spec)
        lines.append(f"  {r['role']:<6} {r['B']:>3} | {f(r['measured_ms']):>11} | {f(r['bare_forward_ms']):>15} | "
                     f"{f(r['roofline_ms']):>11} | {f(r.get('measured_over_bare'), '.2f'):>13} | "
                     f"{f(r.get('bare_over_roofline'), '.2f'):>13} | "
                     f"{r.get('bare_kernels', '-'):>12} ({r.get('step_kernels', '-')}) | "
                     f"{f(r.get('us_per_kernel_over_roofline'), '.1f')}")
        if r.get("fused_forward_ms"):
            lines.append(f"         fused projections (wq|wk|wv, gate|up): {r['fused_forward_ms']:.3f} ms, "
                         f"{r['fused_kernels']} kernels = {r['fused_forward_ms'] / r['bare_forward_ms']:.2f}x "
                         "the bare forward (interleaved)")
        share = r.get("in_step")
        if share and "share_ms" in share:
            lines.append(f"         the drafter's share of a K={share['K']} step: {share['share_ms']:.3f} ms "
                         f"({share['step_ms']:.3f} against {share['verify_only_ms']:.3f} verify-only), "
                         f"{share['per_draft_token_ms']:.3f} ms a draft token = "
                         f"{share['per_draft_token_ms'] / r['bare_forward_ms']:.2f}x the bare forward")
        elif share:
            lines.append(f"         the drafter's share of a step: not run: {share.get('error') or share.get('skipped')}")
    return lines


@dataclasses.dataclass(frozen=True, eq=False)
class ZeroDrafts(Drafter):
    """A drafter's stand-in that proposes zeros and never runs: its step is the real one's
    target work (K + 1 tokens verified, acceptance, commit) without the drafter's."""

    inner: Drafter = None

    def bind_params(self, draft_params, target_graph, target_params):
        return self.inner.bind_params(draft_params, target_graph, target_params)

    def propose(self, params, state, ctx, K):
        return Proposal(jnp.zeros((ctx.length.shape[0], K), jnp.int32), None, state)

    def commit(self, state, ctx, K, n_accepted, new_length):
        return self.inner.commit(state, ctx, K, n_accepted, new_length)


def draft_share_point(engine, batch: int, context: int, reps: int) -> dict:
    """The drafter's share of a step at K = max_k, `batch` greedy rows at `context`: the
    engine's step program against the same step with `ZeroDrafts` (the verify-only step),
    timed interleaved, the share the median of the paired differences. Per draft token:
    the share / K (the first token's two-token window read included)."""
    from dsd_jax.profiler import time_steps
    if engine.drafter.needs_features:
        raise ValueError("the verify-only step needs a drafter that its target forward does not feed")
    K = engine.max_k
    if K < 1:
        raise ValueError("the drafter's share needs max_k >= 1")
    steps = {"step": engine.programs.step(K, batch),
             "verify_only": engine.programs.step_with_drafter(ZeroDrafts(inner=engine.drafter), K, batch)}
    ms = time_steps(engine, steps, batch, context, repeats=reps)
    share = statistics.median(np.subtract(ms["step"], ms["verify_only"]).tolist())
    return {"role": "draft in step", "B": batch, "context": context, "K": K,
            "step_ms": statistics.median(ms["step"]), "verify_only_ms": statistics.median(ms["verify_only"]),
            "share_ms": share, "per_draft_token_ms": share / K}
