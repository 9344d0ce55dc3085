"""Weights straight from a trainer: declared mappings from its param tree onto the engine's.

A trainer keeps its policy in its own module classes (Tunix's `Llama3`, MaxText, a user's
NNX model), with its own names and layouts. A `ParamMapping` declares, once per model
family, where each of our leaves comes from:

    Rule("layers.{i}.attn.q_proj.w", "layers.{i}.wq", "merge_out")

reads "our layer-i `wq` is the trainer's `layers.i.attn.q_proj.w` with its trailing head
axes merged". Leaf names are the tree paths joined by dots (`nnx.State` and nested
dicts alike), `{i}` standing for a layer index. Transforms are declared, not arbitrary
code, so a mapping can be checked against shapes alone before anything is copied:

- "identity"   the same array;
- "transpose"  a 2-D [out, in] weight as our [in, out];
- "merge_out"  [in, heads, head_dim] -> [in, heads * head_dim] (q/k/v projections);
- "merge_in"   [heads, head_dim, out] -> [heads * head_dim, out] (the o projection).

`map_params(mapping, state, like)` checks the whole plan first (every one of our leaves
covered, every trainer leaf used or declared ignorable, every shape equal after its
transform; each failure names the leaf), then runs the transforms as one jitted program
on the trainer's devices and moves the results device to device onto `like`'s shardings:
nothing goes through the host (Tunix syncs weights under transfer guards that forbid
it) and, the shapes and shardings being those the engine compiled for, nothing of the
engine recompiles. The conversion program itself compiles once per trainer layout.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Sequence

import jax
import numpy as np

from dsd_jax.models.hf import FLOAT_DTYPES as CHECKPOINT_FLOAT_DTYPES

TRANSFORMS = ("identity", "transpose", "merge_out", "merge_in")
# Dtypes a trainer leaf may have to feed one of our parameters, by name (a leaf's dtype may
# be one numpy lacks): those a checkpoint may store (casting int8 codes would give garbage).
FLOAT_DTYPES = tuple(str(t) for t in CHECKPOINT_FLOAT_DTYPES)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Our leaf `ours` is the trainer's leaf `theirs` after `transform` ({i}: layer index)."""

    theirs: str
    ours: str
    transform: str = "identity"

    def __post_init__(self):
        if self.transform not in TRANSFORMS:
            raise ValueError(f"unknown transform {self.transform!r} for {self.ours!r}; "
                             f"known: {', '.join(TRANSFORMS)}")
        if ("{i}" in self.theirs) != ("{i}" in self.ours):
            raise ValueError(f"rule {self.theirs!r} -> {self.ours!r}: '{{i}}' must appear on both "
                             "sides or on neither")


@dataclasses.dataclass(frozen=True)
class ParamMapping:
    """A model family's declared mapping. `ignore`: regular expressions of trainer leaves
    that are deliberately unused (anything else left over is an error)."""

    name: str
    rules: tuple[Rule, ...]
    ignore: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(self, "ignore", tuple(self.ignore))
        seen = set()
        for r in self.rules:
            if r.ours in seen:
                raise ValueError(f"mapping {self.name!r} declares our leaf {r.ours!r} twice")
            seen.add(r.ours)


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(\d+)") + "$")


# ---- trees as {dotted name: leaf} ----------------------------------------------------------

def _key_name(key) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def flatten(tree) -> tuple[dict[str, Any], Any]:
    """({dotted leaf name: leaf}, treedef) of a pytree (an `nnx.State`, an `nnx.Module`'s
    Params, nested dicts and lists). NNX Variables contribute no name of their own."""
    from flax import nnx
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree, nnx.Param)
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    named = {}
    for path, leaf in pairs:
        parts = [_key_name(k) for k in path]
        if len(parts) > 1 and parts[-1] == "value" and type(path[-1]).__name__ == "GetAttrKey":
            parts = parts[:-1]  # the Variable's own `.value`
        named[".".join(parts)] = leaf
    return named, treedef


# ---- the plan: checked on shapes alone ------------------------------------------------------

def rule_reading(mapping: ParamMapping, theirs: str) -> tuple[str, str] | None:
    """(our leaf, transform) of the rule reading the trainer's leaf `theirs`, or None."""
    for rule in mapping.rules:
        m = _pattern(rule.theirs).match(theirs)
        if m:
            return (rule.ours.replace("{i}", m.group(1)) if m.groups() else rule.ours), rule.transform
    return None


def after(transform: str, shape: tuple) -> tuple | None:
    """The shape a transform gives, or None when it does not apply to this rank."""
    if transform == "identity":
        return shape
    if transform == "transpose":
        return shape[::-1] if len(shape) == 2 else None
    if transform == "merge_out":
        return (shape[0], int(np.prod(shape[1:]))) if len(shape) >= 2 else None
    if transform == "merge_in":
        return (int(np.prod(shape[:-1])), shape[-1]) if len(shape) >= 2 else None
    raise AssertionError(transform)


@functools.lru_cache(maxsize=64)
def plan(mapping: ParamMapping, theirs: tuple, ours: tuple) -> tuple:
    """((their name, our name, transform), ...) in our leaf order, from ((name, shape,
    dtype name), ...) of the trainer's tree and ((name, shape), ...) of ours. Raises
    ValueError naming the first leaf that does not fit (a leaf feeding one of ours must
    have a floating dtype; ignored ones, e.g. step counters, may have any)."""
    their_shapes = {name: shape for name, shape, _ in theirs}
    their_dtypes = {name: dtype for name, _, dtype in theirs}
    steps, used = [], set()
    compiled = [(r, _pattern(r.ours)) for r in mapping.rules]
    for name, shape in ours:
        for rule, pat in compiled:
            m = pat.match(name)
            if m:
                break
        else:
            raise ValueError(f"mapping {mapping.name!r} does not cover our leaf {name!r} "
                             f"(shape {shape}): add a Rule for it")
        source = rule.theirs.replace("{i}", m.group(1)) if m.groups() else rule.theirs
        if source not in their_shapes:
            near = [n for n in their_shapes if n.split(".")[-1] == source.split(".")[-1]][:3]
            raise ValueError(f"mapping {mapping.name!r}: the trainer's state has no leaf {source!r} "
                             f"(for our {name!r})" + (f"; similar: {near}" if near else ""))
        if their_dtypes[source] not in FLOAT_DTYPES:
            raise ValueError(f"mapping {mapping.name!r}: trainer leaf {source!r} (for our {name!r}) has "
                             f"dtype {their_dtypes[source]}, expected a floating dtype "
                             f"({', '.join(FLOAT_DTYPES)}): a quantised or non-weight leaf?")
        got = after(rule.transform, tuple(their_shapes[source]))
        if got != tuple(shape):
            raise ValueError(f"mapping {mapping.name!r}: trainer leaf {source!r} of shape "
                             f"{tuple(their_shapes[source])} gives {got} after {rule.transform!r}, "
                             f"but our {name!r} has shape {tuple(shape)}")
        steps.append((source, name, rule.transform))
        used.add(source)
    ignore = [re.compile(p) for p in mapping.ignore]
    unused = sorted(n for n in their_shapes if n not in used and not any(p.fullmatch(n) for p in ignore))
    if unused:
        shown = ", ".join(repr(n) for n in unused[:6]) + (" ..." if len(unused) > 6 else "")
        raise ValueError(f"mapping {mapping.name!r} leaves {len(unused)} trainer leaf(s) unused: "
                         f"{shown} (a feature this model family does not implement? declare it in "
                         "`ignore` only if the forward really does not use it)")
    return tuple(steps)


# ---- the conversion: one program on the trainer's devices, then device to device -----------

def apply(transform: str, x, shape, dtype):
    """`transform` of a trainer array x, as our leaf of `shape` and `dtype`."""
    if transform == "transpose":
        x = x.T
    elif transform in ("merge_out", "merge_in"):
        x = x.reshape(shape)
    return x.astype(dtype)


@functools.partial(jax.jit, static_argnums=(0,))
def _convert(steps_shapes: tuple, leaves: tuple):
    return tuple(apply(t, x, shape, dtype) for (t, shape, dtype), x in zip(steps_shapes, leaves))


def map_params(mapping: ParamMapping, state, like):
    """`like` (our param tree, e.g. the engine's) with every leaf taken from `state` (the
    trainer's tree) by `mapping`, cast to our dtypes and placed on `like`'s shardings, in
    buffers of its own (never the trainer's)."""
    their_leaves, _ = flatten(state)
    our_leaves, treedef = flatten(like)
    for n, x in their_leaves.items():
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise ValueError(f"trainer leaf {n!r} is a {type(x).__name__}, not an array")
    # str, not np.dtype: an ignored leaf may have a dtype numpy lacks (a PRNG key's)
    steps = plan(mapping, tuple((n, tuple(x.shape), str(x.dtype)) for n, x in their_leaves.items()),
                 tuple((n, tuple(x.shape)) for n, x in our_leaves.items()))
    targets = [our_leaves[ours] for _, ours, _ in steps]
    spec = tuple((t, tuple(o.shape), np.dtype(o.dtype)) for (_, _, t), o in zip(steps, targets))
    inputs = tuple(their_leaves[theirs] for theirs, _, _ in steps)
    out = _convert(spec, inputs)
    # device to device onto the engine's layout (a no-op where it already lies there); a
    # leaf `_convert` handed back as given (jit may forward an unchanged input) is copied:
    # the result never shares the trainer's buffers, which its next step may donate
    out = [_placed(x, getattr(o, "sharding", None), copy=x is given)
           for x, o, given in zip(out, targets, inputs)]
    return jax.tree_util.tree_unflatten(treedef, out)


def _placed(x, sharding, copy: bool):
    if sharding is None and not copy:
        return x
    return jax.device_put(x, sharding or x.sharding, may_alias=False if copy else None)


def set_params_from(engine, mapping: ParamMapping, state, role: str = "target") -> None:
    """`SpecEngine.set_params_from`: the engine's `role` ("target" or "draft") params taken
    from a trainer's tree by `mapping`; compiles none of the engine's programs."""
    if role not in ("target", "draft"):
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    old = engine._target_params if role == "target" else engine._draft_params
    if old is None:
        raise ValueError("this engine has no draft model")
    engine.set_params(**{role: map_params(mapping, state, old)}, copy=False)  # already its own


# ---- declared families ---------------------------------------------------------------------

def _layer_rules(attn: str, extra: Sequence[Rule] = ()) -> tuple[Rule, ...]:
    return (
        Rule("layers.{i}.input_layernorm.w", "layers.{i}.attn_norm"),
        Rule(f"layers.{{i}}.{attn}.q_proj.w", "layers.{i}.wq", "merge_out"),
        Rule(f"layers.{{i}}.{attn}.k_proj.w", "layers.{i}.wk", "merge_out"),
        Rule(f"layers.{{i}}.{attn}.v_proj.w", "layers.{i}.wv", "merge_out"),
        Rule(f"layers.{{i}}.{attn}.o_proj.w", "layers.{i}.wo", "merge_in"),
        *extra,
        Rule("layers.{i}.post_attention_layernorm.w", "layers.{i}.mlp_norm"),
        Rule("layers.{i}.mlp.gate_proj.kernel", "layers.{i}.w_gate"),
        Rule("layers.{i}.mlp.up_proj.kernel", "layers.{i}.w_up"),
        Rule("layers.{i}.mlp.down_proj.kernel", "layers.{i}.w_down"),
    )


_TOP = (
    Rule("embedder.input_embedding", "embed"),
    Rule("final_norm.w", "final_norm"),
    Rule("lm_head.w", "lm_head"),
)

# tunix.models.llama3.model.Llama3 (Tunix 0.1.7): Einsum q/k/v [d, heads, head_dim],
# o [heads, head_dim, d]; nnx.Linear MLP kernels [in, out] as ours.
TUNIX_LLAMA3 = ParamMapping("tunix.llama3", _TOP + _layer_rules("attn"))

# tunix.models.qwen3.model.Qwen3 (dense): Llama3's layout plus per-head q/k RMSNorm.
TUNIX_QWEN3 = ParamMapping("tunix.qwen3", _TOP + _layer_rules("attn", (
    Rule("layers.{i}.attn.q_norm.w", "layers.{i}.q_norm"),
    Rule("layers.{i}.attn.k_norm.w", "layers.{i}.k_norm"),
)))
