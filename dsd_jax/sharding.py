"""Where every array lives on a `jax.sharding` mesh with axes "data" and "model".

Megatron-style tensor parallelism on "model": q/k/v and gate/up are split by columns
(whole heads for q/k/v), o and down by rows, so each layer needs one all-reduce after o
and one after down; the embedding is split by vocabulary rows and the LM head by
vocabulary columns (the logits stay split by vocabulary; sampling reduces over it). q and
o are split only when the query heads divide the axis (a split inside a head would make
attention gather its halves), K/V projections and the KV cache only when the KV heads do
(Qwen2.5-7B has 4 KV heads under tensor parallel 8): otherwise replicated, so each
device holds every head its share of the work needs. Slots (the first axis of the decode state) are
split on "data". A dimension the axis does not divide stays replicated, so any model
runs on any mesh; `memory_report` shows what that costs.

Nothing here allocates: the same rules give per-device bytes from abstract shapes.
"""

from __future__ import annotations

import math
from typing import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA, MODEL = "data", "model"

# parameter name -> which axis of its array is split on "model"
_COLUMNS = {"w_gate", "w_up", "lm_head"}  # last axis (output features)
_Q_COLUMNS = {"wq", "bq"}  # last axis, only when the query heads divide the axis
_KV_COLUMNS = {"wk", "wv", "bk", "bv"}  # last axis, only when the KV heads divide the axis
_Q_ROWS = {"wo"}  # first axis, only when the query heads divide the axis
_ROWS = {"w_down", "embed"}  # first axis (input features; vocabulary for embed)


def axis_sizes(mesh: Mesh | Mapping[str, int] | None) -> dict[str, int]:
    """{"data": n, "model": m} of a mesh (or of a plain mapping); a missing axis is 1."""
    if mesh is None:
        return {DATA: 1, MODEL: 1}
    shape = dict(mesh.shape) if isinstance(mesh, Mesh) else dict(mesh)
    unknown = set(shape) - {DATA, MODEL}
    if unknown:
        raise ValueError(f"mesh axes must be named {DATA!r} and/or {MODEL!r}, got {sorted(shape)}")
    return {DATA: int(shape.get(DATA, 1)), MODEL: int(shape.get(MODEL, 1))}


def auto_axes(mesh: Mesh | None) -> Mesh | None:
    """`mesh` with its axes in Auto mode (the engine's shardings are propagated by GSPMD;
    `jax.make_mesh` makes Explicit axes by default, under which the model's gathers fail
    while tracing), or a TypeError for anything that is not a Mesh."""
    if mesh is None:
        return None
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (dsd_jax.sharding.make_mesh(data, model)), "
                        f"got {type(mesh).__name__}")
    auto = (jax.sharding.AxisType.Auto,) * len(mesh.axis_names)
    if tuple(mesh.axis_types) == auto:
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=auto)


def _param_name(path) -> str:
    names = [k.key for k in path if isinstance(getattr(k, "key", None), str)]
    return names[-1] if names else ""


def heads_of(config) -> tuple[int, int] | None:
    """(query heads, KV heads) of a model config, or None without one."""
    return None if config is None else (config.num_heads, config.num_kv_heads)


def param_spec(name: str, shape, heads: tuple[int, int], sizes: Mapping[str, int]) -> P:
    """PartitionSpec of the parameter `name` (a leaf name of `models.Transformer`) of a
    model with `heads` = (query heads, KV heads)."""
    m = sizes.get(MODEL, 1)
    q_whole, kv_whole = heads[0] % m == 0, heads[1] % m == 0
    split = None
    if name in _COLUMNS or (name in _Q_COLUMNS and q_whole) or (name in _KV_COLUMNS and kv_whole):
        split = len(shape) - 1
    elif name in _ROWS or (name in _Q_ROWS and q_whole):
        split = 0
    if split is None or m == 1 or shape[split] % m:
        return P()
    spec = [None] * len(shape)
    spec[split] = MODEL
    return P(*spec)


def param_specs(params, heads: tuple[int, int], sizes: Mapping[str, int]):
    """The PartitionSpec tree of a model's `nnx.state` (or its abstract shapes)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: param_spec(_param_name(path), x.shape, heads, sizes), params)


def _slots_spec(shape, sizes, model_axis: int | None = None, model_dim: int = 1) -> P:
    """Slots (axis 0) on "data" when it divides them; `model_axis` on "model" likewise."""
    spec = [None] * len(shape)
    if sizes.get(DATA, 1) > 1 and shape and shape[0] % sizes[DATA] == 0:
        spec[0] = DATA
    m = sizes.get(MODEL, 1)
    if model_axis is not None and m > 1 and model_dim % m == 0:
        spec[model_axis] = MODEL
    return P(*spec)


def state_specs(state, target_kv_heads: int, draft_kv_heads: int | None, sizes):
    """PartitionSpec tree of a `DecodeState` (or its abstract shapes).

    KV caches [N, Hkv, S, D]: slots on "data", KV heads on "model" when they divide it.
    Every other per-slot array: slots on "data". The cumulative acceptance counters:
    replicated.
    """
    def kv_specs(kv, heads):
        return jax.tree.map(lambda x: _slots_spec(x.shape, sizes, 1, heads), kv)

    specs = jax.tree.map(lambda x: _slots_spec(x.shape, sizes), state)
    specs = specs._replace(target_kv=kv_specs(state.target_kv, target_kv_heads),
                           accepted_per_pos=P(), proposed_per_pos=P())  # [max_k], not per slot
    drafter = getattr(state.drafter, "kv", None)
    if drafter is not None:  # a draft model's cache: the same layout as the target's
        specs = specs._replace(drafter=specs.drafter._replace(kv=kv_specs(drafter, draft_kv_heads)))
    return specs


def named(mesh: Mesh, specs):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda s: isinstance(s, P))


def per_device_bytes(tree, specs, sizes: Mapping[str, int]) -> int:
    """Bytes one device holds of `tree` (arrays or ShapeDtypeStructs) laid out by `specs`."""
    total = 0
    for x, spec in zip(jax.tree.leaves(tree), jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))):
        split = math.prod(sizes.get(a, 1) for a in spec if a is not None)
        total += x.size * np.dtype(x.dtype).itemsize // split
    return total


def default_device():
    """The device new arrays go to (`jax.default_device` if set, else this process's first)."""
    device = jax.config.jax_default_device
    if isinstance(device, str):  # a platform name
        return jax.local_devices(backend=device)[0]
    return device if device is not None else jax.local_devices()[0]


class Placement:
    """How one engine lays out its arrays: one device (`mesh=None`) or a mesh.

    Without a mesh every method but `put_params` is the identity (arrays stay where JAX
    puts them: the default device), so the single-device engine compiles exactly the
    programs it always did.
    """

    def __init__(self, mesh: Mesh | None, target_heads: tuple[int, int],
                 draft_heads: tuple[int, int] | None):
        """target_heads, draft_heads: (query heads, KV heads) of each model (`heads_of`),
        draft_heads None without a draft model."""
        self.mesh = auto_axes(mesh)
        self.sizes = axis_sizes(mesh)
        self.heads = {"target": target_heads, "draft": draft_heads}
        self.kv_heads = {role: None if h is None else h[1] for role, h in self.heads.items()}
        # where the engine's arrays go, fixed at construction: a later `jax.default_device`
        # around a call must not move them, nor change what the engine says it runs on
        self.device = default_device() if self.mesh is None else self.mesh.devices.flat[0]

    @property
    def replicated(self) -> NamedSharding | None:
        return None if self.mesh is None else NamedSharding(self.mesh, P())

    def param_shardings(self, params, role: str):
        if self.mesh is None or params is None:
            return None
        return named(self.mesh, param_specs(params, self.heads[role], self.sizes))

    def state_shardings(self, state):
        if self.mesh is None:
            return None
        return named(self.mesh, state_specs(state, self.kv_heads["target"], self.kv_heads["draft"],
                                            self.sizes))

    def data_specs(self, state):
        """The state's specs naming only "data" (the in/out specs of a program run per
        data shard; the "model" layout inside stays automatic)."""
        return state_specs(state, 1, 1, {DATA: self.sizes[DATA]})

    def put_params(self, params, role: str):
        """Params onto their shardings (without a mesh: the default device, where the
        engine's state and programs are; arrays already there are kept, not copied);
        device-to-device when they are already on devices (a trainer's sharded output), so
        transfer guards against host copies hold."""
        if params is None:
            return None
        shardings = self.param_shardings(params, role)
        if shardings is None:
            shardings = jax.sharding.SingleDeviceSharding(self.device)
        return jax.device_put(params, shardings)

    def new_state(self, make):
        """`make()` (an `init_state` call) built directly in its shardings: a large cache is
        never materialised on one device first. In 32 bits, as the programs that take it."""
        with jax.enable_x64(False):
            if self.mesh is None:
                return make()
            return jax.jit(make, out_shardings=self.state_shardings(jax.eval_shape(make)))()

    def abstract(self, tree, shardings=None):
        """ShapeDtypeStructs of `tree` carrying `shardings` (a tree of them, one for every
        leaf, or None: unspecified)."""
        if shardings is None:
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
        if isinstance(shardings, NamedSharding):
            shardings = jax.tree.map(lambda _: shardings, tree)
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, shardings)


def memory_report(target_cfg, draft_cfg, spec, sizes: Mapping[str, int], max_batch_size: int,
                  max_seq_len: int) -> dict:
    """Bytes per device of an engine's params, KV caches and the rest of its state, from
    abstract shapes only (nothing is allocated, so any model and mesh can be sized here).

    target_cfg, draft_cfg: `models.ModelConfig` (draft None without a draft model; an
    `Eagle3Config` for an EAGLE-3 head: its params, its one-layer cache as ``kv_cache["draft"]``
    and the stored target features as ``features``); spec: `SpecConfig`; sizes: {"data": n,
    "model": m}.
    """
    from dsd_jax import drafters
    from dsd_jax.state import init_state

    sizes = axis_sizes(sizes)
    drafter_cls = drafters.get(spec.method)
    drafter = drafter_cls.build(spec, (None, draft_cfg) if drafter_cls.needs_model else None)
    capacity = max_seq_len + spec.max_k + 1
    state = jax.eval_shape(lambda: init_state(target_cfg, drafter, max_batch_size, capacity,
                                              spec.max_k))
    specs = state_specs(state, target_cfg.num_kv_heads,
                        None if draft_cfg is None else draft_cfg.num_kv_heads, sizes)

    def params_bytes(cfg):
        if cfg is None:
            return 0
        params = _abstract_params(cfg)
        return per_device_bytes(params, param_specs(params, heads_of(cfg), sizes), sizes)

    def drafter_bytes(name):
        part = getattr(state.drafter, name, None)
        return 0 if part is None else per_device_bytes(part, getattr(specs.drafter, name), sizes)

    kv = {"target": per_device_bytes(state.target_kv, specs.target_kv, sizes), "draft": drafter_bytes("kv")}
    features = drafter_bytes("features")
    everything = per_device_bytes(state, specs, sizes)
    report = {
        "mesh": sizes,
        "params": {"target": params_bytes(target_cfg), "draft": params_bytes(draft_cfg)},
        "kv_cache": kv,
        "features": features,  # an EAGLE-3 head's stored target features (0 for other methods)
        "state_other": everything - kv["target"] - kv["draft"] - features,
    }
    report["total"] = sum(report["params"].values()) + everything
    return report


def _abstract_params(cfg):
    """The abstract `nnx.state` of the model `cfg` describes: a Transformer, or an EAGLE-3 head
    (fc, one decoder layer over [embedding, hidden], reduced-vocabulary LM head; the target's
    embedding, which it shares, is counted with the target)."""
    from flax import nnx

    from dsd_jax.models import init_model
    from dsd_jax.models.eagle3 import Eagle3Config, Eagle3Head
    if isinstance(cfg, Eagle3Config):
        return jax.eval_shape(lambda: nnx.state(Eagle3Head(cfg, rngs=nnx.Rngs(0))))
    return jax.eval_shape(lambda: nnx.state(init_model(cfg)))


def make_mesh(data: int = 1, model: int = 1, devices=None) -> Mesh:
    """A ("data", "model") mesh over the first data * model devices, axes in Auto mode
    (GSPMD propagates shardings; `jax.make_mesh` defaults to Explicit axes)."""
    devices_given = devices
    devices = list(jax.devices() if devices is None else devices)
    if data < 1 or model < 1:
        raise ValueError(f"mesh sizes must be >= 1, got data={data}, model={model}")
    if data * model > len(devices):
        raise ValueError(f"a {data}x{model} mesh needs {data * model} devices, "
                         f"{'jax.devices() (every process) has' if devices_given is None else 'got'} "
                         f"{len(devices)}")
    return Mesh(np.array(devices[:data * model]).reshape(data, model), (DATA, MODEL))
