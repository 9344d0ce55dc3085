"""LoRA adapters merged into the weights they adapt, for a trainer that syncs only them.

Tunix trains a LoRA policy (qwix's `LoraProvider`) by updating only its `nnx.LoRAParam`s
and syncs exactly those to the rollout engine (`update_params(state, (nnx.LoRAParam,))`).
qwix gives an adapted weight W (a trainer leaf such as `layers.0.attn.q_proj.w`) two leaves,
`W_lora_a` [W's contracted dims..., rank] and `W_lora_b` [rank, W's output dims...], and its
forward adds `(x @ a) @ b * alpha / rank` to `x @ W`.

The engine serves merged weights, W + (alpha / rank) * a.b reshaped as W: its programs stay
the plain ones and a token costs what it costs without LoRA. So it keeps the base W of every
adapted leaf (in its own layout, a second copy of those leaves in device memory), and each
sync recomputes those leaves from the base and the new adapters in one jitted program on
the engine's devices: merges never accumulate rounding, nothing goes through the host, and
the program compiles once (`SpecRollout` runs a first sync when it is built).
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from dsd_jax import param_mapping

SUFFIXES = ("_lora_a", "_lora_b")


def split(named: dict) -> tuple[dict, dict]:
    """(the plain leaves, {adapted weight's name: (lora_a, lora_b)}) of a flattened trainer
    tree (`param_mapping.flatten`). A half without the other is an error naming it."""
    plain, halves = {}, {}
    for name, leaf in named.items():
        for i, suffix in enumerate(SUFFIXES):
            if name.endswith(suffix):
                halves.setdefault(name[:-len(suffix)], [None, None])[i] = leaf
                break
        else:
            plain[name] = leaf
    for weight, (a, b) in sorted(halves.items()):
        if a is None or b is None:
            have, lack = (weight + SUFFIXES[1], SUFFIXES[0]) if a is None else (weight + SUFFIXES[0], SUFFIXES[1])
            raise ValueError(f"LoRA leaf {have!r} has no {weight + lack!r} beside it")
    return plain, {weight: (a, b) for weight, (a, b) in halves.items()}


def has_adapters(named: dict) -> bool:
    return any(name.endswith(SUFFIXES) for name in named)


@functools.lru_cache(maxsize=64)
def plan(mapping: param_mapping.ParamMapping, adapters: tuple, ours: tuple) -> tuple:
    """((adapted weight, our leaf, transform, rank), ...) from ((weight, a shape, b shape,
    a dtype name, b dtype name), ...) and ((our leaf, shape), ...). Raises ValueError naming
    the adapter that does not fit: one on a weight no rule of `mapping` reads, ranks that
    differ between its halves, a product that is not its weight's shape after the rule's
    transform, or a dtype that is not a float."""
    our_shapes = dict(ours)
    steps = []
    for weight, a_shape, b_shape, a_dtype, b_dtype in adapters:
        found = param_mapping.rule_reading(mapping, weight)
        if found is None:
            raise ValueError(f"LoRA adapter on {weight!r}: no rule of mapping {mapping.name!r} reads that "
                             "weight, so the engine has nothing to merge it into")
        leaf, transform = found
        if transform == "transpose":  # a.b is [contracted..., output...], W then is not
            raise ValueError(f"LoRA adapter on {weight!r}: its rule transposes the weight, and the merge "
                             "knows adapters of weights laid out [contracted dims..., output dims...] only")
        for half, dtype in zip(SUFFIXES, (a_dtype, b_dtype)):
            if dtype not in param_mapping.FLOAT_DTYPES:
                raise ValueError(f"LoRA leaf {weight + half!r} has dtype {dtype}, expected a float")
        if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[0]:
            raise ValueError(f"LoRA adapter on {weight!r}: lora_a {tuple(a_shape)} and lora_b "
                             f"{tuple(b_shape)} do not share a rank (a's last axis, b's first)")
        product = tuple(a_shape[:-1]) + tuple(b_shape[1:])
        got = param_mapping.after(transform, product)
        if leaf not in our_shapes or got != tuple(our_shapes[leaf]):
            raise ValueError(f"LoRA adapter on {weight!r}: its product has shape {product}, which gives "
                             f"{got} after {transform!r}, but our {leaf!r} has shape "
                             f"{tuple(our_shapes.get(leaf, ()))}")
        steps.append((weight, leaf, transform, int(a_shape[-1])))
    return tuple(steps)


@functools.partial(jax.jit, static_argnums=(0,))
def _merge(spec: tuple, base: tuple, a: tuple, b: tuple) -> tuple:
    """base + scale * a.b, laid out as ours, per adapted leaf (spec: (transform, our shape,
    scale) each). In float32 at full precision (a TPU's default would take bf16 passes)."""
    out = []
    for (transform, shape, scale), w, x, y in zip(spec, base, a, b):
        delta = jnp.tensordot(x.astype(jnp.float32), y.astype(jnp.float32), 1,
                              precision=jax.lax.Precision.HIGHEST) * scale
        merged = w.astype(jnp.float32) + param_mapping.apply(transform, delta, shape, jnp.float32)
        out.append(merged.astype(w.dtype))
    return tuple(out)


def _replicated(sharding):
    """The sharding that puts a whole (small) adapter on every device of `sharding`."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    return sharding


class LoraWeights:
    """The engine's side of a LoRA policy: the base weights of the leaves the adapters touch
    and the merge.

    mapping: the policy family's `ParamMapping`; alpha: the `LoraProvider`'s alpha (each
    adapter is scaled by alpha / its rank, as qwix does); state: the trainer's adapters (any
    other leaf is ignored here); base: our param tree holding the unmerged weights
    (`param_mapping.map_params` of the trainer's plain leaves): the adapted leaves' arrays
    are kept, so give it buffers of its own on the engine's devices."""

    def __init__(self, mapping: param_mapping.ParamMapping, alpha: float, state, base):
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < float("inf"):
            raise ValueError(f"lora_alpha must be a positive number, got {alpha!r}")  # also NaN and "16"
        alpha = float(alpha)
        self.mapping, self.alpha = mapping, alpha
        named, _ = param_mapping.flatten(state)
        _, adapters = split(named)
        if not adapters:
            raise ValueError("the policy has no LoRA leaves (qwix's '*_lora_a' / '*_lora_b')")
        self.weights = tuple(sorted(adapters))  # the adapted weights every sync must bring
        self.adapters: dict = {}  # {trainer leaf name: array}: the last synced, on the engine's devices
        ours, _ = param_mapping.flatten(base)
        self._steps = self._plan(adapters, ours)
        self.base = {leaf: ours[leaf] for _, leaf, _, _ in self._steps}

    def _plan(self, adapters: dict, ours: dict) -> tuple:
        """`plan` of these adapters ({weight: (a, b)}) onto our flattened tree."""
        return plan(self.mapping,
                    tuple((w, tuple(a.shape), tuple(b.shape), str(a.dtype), str(b.dtype))
                          for w, (a, b) in sorted(adapters.items())),
                    tuple((n, tuple(x.shape)) for n, x in ours.items()))

    def sync(self, engine, state) -> None:
        """The engine's target weights set to the merge of `state` (`merged`), device to
        device; compiles nothing after the first. A refused sync changes nothing."""
        tree, kept = self._merged(state, engine._target_params)
        engine.set_params(target=tree, copy=False)  # buffers of its own already
        self._steps, self.base, self.adapters = kept

    def merged(self, state, like):
        """`like` (our tree) with every adapted leaf base + scale * a.b from `state`."""
        return self._merged(state, like)[0]

    def _merged(self, state, like) -> tuple:
        """(`like` merged with `state`, what a sync keeps: (the plan, the base weights, the
        adapters on the engine's devices)). `state`: the trainer's adapters (a LoRA-only
        sync), or its whole tree (every weight then comes from it, the base ones too). The
        adapted weights must be the ones this policy had."""
        named, _ = param_mapping.flatten(state)
        plain, adapters = split(named)
        if tuple(sorted(adapters)) != self.weights:
            missing = sorted(set(self.weights) - set(adapters))
            extra = sorted(set(adapters) - set(self.weights))
            raise ValueError("a LoRA sync must bring an adapter for every weight the policy adapts, and "
                             f"only those: missing {missing[:4]}, unexpected {extra[:4]}")
        ours, treedef = param_mapping.flatten(like)
        steps = self._plan(adapters, ours)  # the shapes fit (a new rank gets its own scale)
        if plain:  # a whole tree, mapped and checked like any sync
            ours, treedef = param_mapping.flatten(param_mapping.map_params(self.mapping, plain, like))
            base = {leaf: ours[leaf] for _, leaf, _, _ in steps}
        else:
            base = self.base
        spec = tuple((transform, tuple(ours[leaf].shape), self.alpha / rank) for _, leaf, transform, rank in steps)
        bases = tuple(base[leaf] for _, leaf, _, _ in steps)
        # device to device: the adapters join the base on the engine's devices, whole on each
        on = [_replicated(w.sharding) for w in bases]
        a = tuple(jax.device_put(adapters[weight][0], s) for (weight, *_), s in zip(steps, on))
        b = tuple(jax.device_put(adapters[weight][1], s) for (weight, *_), s in zip(steps, on))
        for (_, leaf, _, _), x, w in zip(steps, _merge(spec, bases, a, b), bases):
            ours[leaf] = jax.device_put(x, w.sharding)
        placed = {}
        for (weight, *_), x, y in zip(steps, a, b):
            placed[weight + SUFFIXES[0]], placed[weight + SUFFIXES[1]] = x, y
        return jax.tree_util.tree_unflatten(treedef, list(ours.values())), (steps, base, placed)
