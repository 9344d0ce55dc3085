"""EAGLE-3 draft heads (Li et al. 2025) as a Flax NNX module, in the layout of the
published checkpoints, with their loader and writer.

A head reads the target's auxiliary hidden states (the residual inputs to three target
layers, by default 2, L//2 and L-3), concatenated (3d):

    h   = fc(aux)                                            # 3d -> d, no bias; first step only
    x   = cat[input_layernorm(embed(token)), hidden_norm(h)] # 2d into q/k/v
    h'  = h + o_proj(attention(x))                           # one decoder layer, residual on h
    h'  = h' + mlp(post_attention_layernorm(h'))
    logits = lm_head(norm(h'))                               # over the draft vocabulary

The head at position p reads the feature of token x_p and the embedding of x_{p+1}, and
predicts x_{p+2}. Later draft steps feed the head's own pre-norm output h' in place of
fc(aux). Draft id i is target id `i + d2t[i]`; `t2d` (a mask over the target vocabulary)
is checked on load and rebuilt on save. The embedding is the target's (passed in), unless
the checkpoint carries its own `embed_tokens.weight`.

    head = models.load_eagle3(directory)     # config.json + model.safetensors (HF keys)
    models.save_eagle3(head, directory)
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from dsd_jax import kernels
from .config import ModelConfig, _is_int, hf_field
from .hf import _TensorReader, _weight_files, check_out_dir, read_hf_config, read_tensor
from .layout import CONFIG_FILE, EAGLE3_ARCHITECTURE, WEIGHTS_FILE, atomic_write
from .transformer import KVCache, _normal, apply_rope, rms_norm, rope_cos_sin

ARCHITECTURE = EAGLE3_ARCHITECTURE  # what `layout.checkpoint_kind` calls a head


def default_aux_layers(num_target_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's feature layers: residual inputs to layers 2, L//2 and L-3."""
    L = num_target_layers
    return (2, L // 2, L - 3)


@dataclasses.dataclass(frozen=True)
class Eagle3Config(ModelConfig):
    """A one-layer Llama-style head; `vocab_size` is the target's, `draft_vocab_size` the
    head's output size. `aux_layers` None: `default_aux_layers` of the target."""

    draft_vocab_size: int = 0
    aux_layers: tuple[int, ...] | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.num_layers != 1:
            raise ValueError(f"an EAGLE-3 head has one decoder layer, got num_layers={self.num_layers}")
        if not _is_int(self.draft_vocab_size) or not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be an integer in 1..vocab_size ({self.vocab_size}), got "
                             f"{self.draft_vocab_size!r}")
        if self.aux_layers is not None:
            aux = self.aux_layers
            if (not isinstance(aux, (list, tuple)) or len(aux) == 0
                    or not all(_is_int(i) and i >= 0 for i in aux)):
                raise ValueError(f"aux_layers must be non-negative layer indices, got {aux!r}")
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in aux))

    def target_aux_layers(self, target: ModelConfig) -> tuple[int, ...]:
        """The target layers to read, checked against the target's shape."""
        if target.hidden_size != self.hidden_size:
            raise ValueError(f"EAGLE-3 head hidden_size {self.hidden_size} != target hidden_size "
                             f"{target.hidden_size}: the head was trained for another target")
        if target.vocab_size != self.vocab_size:
            raise ValueError(f"EAGLE-3 head vocab_size {self.vocab_size} != target vocab_size "
                             f"{target.vocab_size}: the head must share the target's tokenizer")
        layers = self.aux_layers or default_aux_layers(target.num_layers)
        if any(not 0 <= i < target.num_layers for i in layers):
            raise ValueError(f"EAGLE-3 feature layers {layers} are not layers of a "
                             f"{target.num_layers}-layer target (set aux_layers for a shallow one)")
        return tuple(layers)


def _f32_dot(x, w):
    return jnp.matmul(x, w, preferred_element_type=jnp.float32)


def _f32_dot_cpu(x, w):
    # XLA:CPU transposes this dot to feed `target_logits`' scatter, and its DotThunk has no
    # bf16 x bf16 -> f32 kernel; upcasting first costs nothing elsewhere (other platforms
    # never lower this branch) and gives the same products (bf16 x bf16 is exact in f32)
    return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))


class VocabMap(nnx.Variable):
    """Integer arrays that travel with the params (d2t) but are never trained."""


class Eagle3Head(nnx.Module):
    def __init__(self, cfg: Eagle3Config, *, rngs: nnx.Rngs, own_embed: bool = False):
        self.config = cfg
        dt = cfg.jnp_dtype
        d, hq, hkv, hd, f = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size)
        num_aux = len(cfg.aux_layers) if cfg.aux_layers else 3
        self.fc = _normal(rngs, (num_aux * d, d), dt)
        self.input_layernorm = nnx.Param(jnp.ones((d,), dt))
        self.hidden_norm = nnx.Param(jnp.ones((d,), dt))
        self.wq = _normal(rngs, (2 * d, hq * hd), dt)
        self.wk = _normal(rngs, (2 * d, hkv * hd), dt)
        self.wv = _normal(rngs, (2 * d, hkv * hd), dt)
        self.wo = _normal(rngs, (hq * hd, d), dt)
        self.mlp_norm = nnx.Param(jnp.ones((d,), dt))
        self.w_gate = _normal(rngs, (d, f), dt)
        self.w_up = _normal(rngs, (d, f), dt)
        self.w_down = _normal(rngs, (f, d), dt)
        self.norm = nnx.Param(jnp.ones((d,), dt))
        self.lm_head = _normal(rngs, (d, cfg.draft_vocab_size), dt)
        self.d2t = VocabMap(jnp.zeros((cfg.draft_vocab_size,), jnp.int32))
        if own_embed:
            self.embed = _normal(rngs, (cfg.vocab_size, d), dt)

    # ---- the layer, in pieces (the trainer reuses them with its own attention) -------------
    def project(self, aux):
        """fc: target features [B, T, 3d] -> [B, T, d] (first draft step only)."""
        return aux.astype(self.config.jnp_dtype) @ self.fc[...]

    def qkv(self, h, tokens, positions, embed):
        """Rotated q [B, T, Hq, D], k, v [B, T, Hkv, D] of the input (h, next token)."""
        cfg = self.config
        B, T, _ = h.shape
        table = self.embed[...] if hasattr(self, "embed") else embed
        emb = jnp.take(table, tokens, axis=0).astype(h.dtype)
        x = jnp.concatenate([rms_norm(emb, self.input_layernorm[...], cfg.rms_norm_eps),
                             rms_norm(h, self.hidden_norm[...], cfg.rms_norm_eps)], axis=-1)
        q = (x @ self.wq[...]).reshape(B, T, cfg.num_heads, cfg.head_dim)
        k = (x @ self.wk[...]).reshape(B, T, cfg.num_kv_heads, cfg.head_dim)
        v = (x @ self.wv[...]).reshape(B, T, cfg.num_kv_heads, cfg.head_dim)
        cos, sin = rope_cos_sin(cfg, jnp.maximum(positions, 0))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, h, attn):
        """o_proj with the residual on h, then the MLP: the head's pre-norm output."""
        B, T, _ = h.shape
        h = h + attn.reshape(B, T, -1) @ self.wo[...]
        m = rms_norm(h, self.mlp_norm[...], self.config.rms_norm_eps)
        return h + (jax.nn.silu(m @ self.w_gate[...]) * (m @ self.w_up[...])) @ self.w_down[...]

    def logits(self, h):
        """float32 logits [B, T, draft_vocab] of pre-norm outputs h."""
        x = rms_norm(h, self.norm[...], self.config.rms_norm_eps)
        return lax.platform_dependent(x, self.lm_head[...], cpu=_f32_dot_cpu, default=_f32_dot)

    def __call__(self, h, tokens, positions, kv: KVCache, embed, rows=None,
                 attn_backend: str = "auto"):
        """One head pass over T positions per row, writing its KV entries.

        h [B, T, d]: `project(features)` or the head's own previous output; tokens [B, T]:
        the token after each position; positions [B, T] (-1: padding, write dropped);
        embed: the target's embedding table [V, d]. Returns (h' [B, T, d], float32 logits
        [B, T, draft_vocab], KVCache).
        """
        q, k, v = self.qkv(h, tokens, positions, embed)
        attn, kc, vc = kernels.attend_and_write(q, k, v, positions, kv.k[0], kv.v[0], rows,
                                                backend=attn_backend)
        h = self.finish(h, attn)
        return h, self.logits(h), KVCache((kc,), (vc,))

    def target_ids(self, draft_ids):
        return draft_ids + self.d2t[...][draft_ids]

    def target_logits(self, logits):
        """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V], -inf for
        tokens the head cannot propose (so q is exactly 0 there)."""
        V = self.config.vocab_size
        full = jnp.full(logits.shape[:-1] + (V,), -jnp.inf, logits.dtype)
        ids = jnp.arange(self.config.draft_vocab_size) + self.d2t[...]
        return full.at[..., ids].set(logits)


def init_eagle3(cfg: Eagle3Config, seed: int = 0) -> Eagle3Head:
    """A randomly initialised head whose draft vocabulary is the first `draft_vocab_size`
    target ids (set `head.d2t` for another one)."""
    return Eagle3Head(cfg, rngs=nnx.Rngs(seed))


# ---- Hugging Face layout ----------------------------------------------------------------

# our parameter -> (HF key, transpose?)
_KEYS = {
    "fc": ("fc.weight", True),
    "input_layernorm": ("midlayer.input_layernorm.weight", False),
    "hidden_norm": ("midlayer.hidden_norm.weight", False),
    "wq": ("midlayer.self_attn.q_proj.weight", True),
    "wk": ("midlayer.self_attn.k_proj.weight", True),
    "wv": ("midlayer.self_attn.v_proj.weight", True),
    "wo": ("midlayer.self_attn.o_proj.weight", True),
    "mlp_norm": ("midlayer.post_attention_layernorm.weight", False),
    "w_gate": ("midlayer.mlp.gate_proj.weight", True),
    "w_up": ("midlayer.mlp.up_proj.weight", True),
    "w_down": ("midlayer.mlp.down_proj.weight", True),
    "norm": ("norm.weight", False),
    "lm_head": ("lm_head.weight", True),
    "embed": ("embed_tokens.weight", False),
}


# config.json switches of other EAGLE-3 variants -> the value that means the layer above
_PLAIN_LAYER = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
                "norm_output": False, "use_aux_hidden_state": True}


def eagle3_config_from_hf(hf: dict, dtype: str = "float32") -> Eagle3Config:
    if not isinstance(hf, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(hf).__name__}")
    if hf_field(hf, "num_hidden_layers", int, 1) != 1:
        raise ValueError(f"an EAGLE-3 head has one decoder layer; config.json says "
                         f"num_hidden_layers={hf['num_hidden_layers']}")
    hf = {"model_type": "llama", **hf, "num_hidden_layers": 1}
    if hf.get("target_hidden_size") not in (None, hf.get("hidden_size")):
        raise ValueError(f"unsupported: target_hidden_size {hf['target_hidden_size']} != hidden_size "
                         f"{hf.get('hidden_size')} (a head narrower than its target)")
    base = ModelConfig.from_hf(hf, dtype=dtype)
    vocab = base.vocab_size
    draft_vocab = hf_field(hf, "draft_vocab_size", int, vocab, null_default=True)
    eagle = hf.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise ValueError(f"config.json: eagle_config must be an object, got {eagle!r}")
    # switches other exporters write (vLLM reads them at either level) that change what the
    # layer computes: refused rather than silently run as the plain EAGLE-3 layer
    for key, plain in _PLAIN_LAYER.items():
        for where, block in (("", hf), ("eagle_config.", eagle)):
            if block.get(key) not in (None, plain):
                raise ValueError(f"config.json: {where}{key}={json.dumps(block[key])} is not supported "
                                 f"(only the published EAGLE-3 layer, {key}={json.dumps(plain)})")
    ids = {}
    for where, block in (("", hf), ("eagle_config.", eagle)):
        aux = block.get("eagle_aux_hidden_state_layer_ids")
        if aux is not None and not isinstance(aux, list):
            raise ValueError(f"config.json: {where}eagle_aux_hidden_state_layer_ids must be a list of "
                             f"layer indices, got {aux!r}")
        if aux:  # as vLLM: an empty list is unset
            ids[where] = aux
    if len(ids) == 2 and ids[""] != ids["eagle_config."]:
        raise ValueError(f"config.json: eagle_aux_hidden_state_layer_ids {ids['']} and eagle_config."
                         f"eagle_aux_hidden_state_layer_ids {ids['eagle_config.']} disagree")
    aux = ids.get("") or ids.get("eagle_config.")  # vLLM reads the top-level ids first
    return Eagle3Config(**{f.name: getattr(base, f.name) for f in dataclasses.fields(ModelConfig)},
                        draft_vocab_size=draft_vocab, aux_layers=tuple(aux) if aux else None)


def _check_vocab_map(path, d2t: np.ndarray, t2d: np.ndarray | None, cfg: Eagle3Config) -> np.ndarray:
    if d2t.ndim != 1 or d2t.shape[0] != cfg.draft_vocab_size:
        raise ValueError(f"tensor 'd2t' has shape {tuple(d2t.shape)}, expected "
                         f"({cfg.draft_vocab_size},) (draft_vocab_size in config.json)")
    if not np.issubdtype(d2t.dtype, np.integer):
        raise ValueError(f"tensor 'd2t' must hold integers, got {d2t.dtype}")
    target = np.arange(cfg.draft_vocab_size, dtype=np.int64) + d2t.astype(np.int64)
    bad = np.flatnonzero((target < 0) | (target >= cfg.vocab_size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"checkpoint {path!r}: d2t maps draft id {i} to target id {int(target[i])}, "
                         f"outside [0, {cfg.vocab_size}) ({bad.size} draft ids out of range)")
    if np.unique(target).size != target.size:
        raise ValueError(f"checkpoint {path!r}: d2t maps two draft ids to the same target id")
    if t2d is not None:
        if t2d.shape != (cfg.vocab_size,):
            raise ValueError(f"tensor 't2d' has shape {tuple(t2d.shape)}, expected ({cfg.vocab_size},)")
        mask = np.zeros(cfg.vocab_size, bool)
        mask[target] = True
        if not np.array_equal(t2d.astype(bool), mask):
            raise ValueError(f"checkpoint {path!r}: t2d does not mark exactly the target ids d2t maps to")
    return d2t.astype(np.int32)


def load_eagle3(path, dtype: str = "float32") -> Eagle3Head:
    """Loads a local EAGLE-3 head directory (`config.json` + `model.safetensors` or a
    sharded index, Hugging Face EAGLE-3 keys) as an `Eagle3Head`. "builtin": the head
    trained for the built-in target. Nothing is downloaded.

    Every tensor is checked (present, shape from config.json, d2t in range and one-to-one,
    t2d consistent with it); a tensor the head would not use is an error. The feature
    layers are `eagle_aux_hidden_state_layer_ids`, top-level or in `eagle_config` (as vLLM;
    both must agree); config switches of other variants (`norm_before_residual`,
    `norm_before_fc`, `use_aux_hidden_state: false`, ...) are an error.
    """
    if os.fspath(path) == "builtin":
        from .builtin import BUILTIN_DIR
        path = BUILTIN_DIR / "eagle3"
        if not path.is_dir():
            raise FileNotFoundError(f"the built-in EAGLE-3 head {path} is missing; reinstall dsd-jax "
                                    "or retrain it with `python -m dsd_jax.models.train_eagle3`")
    hf_cfg = read_hf_config(path)
    path = os.fspath(path)
    cfg = eagle3_config_from_hf(hf_cfg, dtype=dtype)
    files = _weight_files(path)
    own_embed = "embed_tokens.weight" in files
    abstract = nnx.eval_shape(lambda: Eagle3Head(cfg, rngs=nnx.Rngs(0), own_embed=own_embed))
    graphdef, state = nnx.split(abstract)
    reader = _TensorReader(files)
    target_dtype = np.dtype(cfg.jnp_dtype)
    values, used = {}, set()
    try:
        for (name,), var in nnx.to_flat_state(state):
            if name == "d2t":
                continue
            key, transpose = _KEYS[name]
            values[name] = read_tensor(reader, files, path, key, tuple(var.get_value().shape),
                                       transpose, target_dtype, "of an EAGLE-3 head")
            used.add(key)
        if "d2t" in files:
            t2d = reader.get("t2d") if "t2d" in files else None
            d2t = _check_vocab_map(path, reader.get("d2t"), t2d, cfg)
            used.update({"d2t", "t2d"} & set(files))
        elif cfg.draft_vocab_size == cfg.vocab_size:
            d2t = np.zeros(cfg.vocab_size, np.int32)  # no mapping: the full target vocabulary
        else:
            raise ValueError(f"checkpoint {path!r} has no 'd2t' tensor but a reduced draft vocabulary "
                             f"({cfg.draft_vocab_size} of {cfg.vocab_size})")
        values["d2t"] = jax.device_put(d2t)
    finally:
        reader.close()
    unexpected = sorted(set(files) - used - {"t2d"})
    if unexpected:
        shown = ", ".join(repr(n) for n in unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        raise ValueError(f"checkpoint {path!r} has {len(unexpected)} tensor(s) an EAGLE-3 head does "
                         f"not use: {shown}")
    for (name,), var in nnx.to_flat_state(state):
        var.set_value(values[name])
    return nnx.merge(graphdef, state)


def hf_eagle3_config(cfg: Eagle3Config) -> dict:
    out = {"architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
           "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size,
           "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
           "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
           "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling_dict,
           "max_position_embeddings": cfg.max_position_embeddings, "tie_word_embeddings": False,
           "torch_dtype": cfg.dtype}
    if cfg.aux_layers is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers)}
    return out


def save_eagle3(head: Eagle3Head, directory, dtype: str | None = None, *, overwrite: bool = False) -> str:
    """Writes `head` in the published layout (`config.json`, `model.safetensors` with
    `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t` int64, `t2d` bool).
    dtype: optionally cast the weights ("float32" or "bfloat16").
    overwrite: replace the EAGLE-3 head already in `directory` (otherwise an error, as `save_hf`);
    any other checkpoint there (a target's Hugging Face one, a `models.save` one) is refused even
    so: this writes config.json and model.safetensors over its own."""
    from safetensors.numpy import save

    cfg = head.config if dtype is None else head.config.replace(dtype=dtype)
    np_dtype = np.dtype(cfg.jnp_dtype)
    directory = check_out_dir(directory, overwrite, "save_eagle3", own="eagle3")
    tensors = {}
    for (name,), var in nnx.to_flat_state(nnx.state(head)):
        arr = np.asarray(jax.device_get(var.get_value()))
        if name == "d2t":
            target = np.arange(cfg.draft_vocab_size) + arr
            t2d = np.zeros(cfg.vocab_size, bool)
            t2d[target] = True
            tensors["d2t"], tensors["t2d"] = arr.astype(np.int64), t2d
            continue
        key, transpose = _KEYS[name]
        tensors[key] = np.ascontiguousarray((arr.T if transpose else arr).astype(np_dtype))
    # each file through a temporary one renamed over it, the config last: a save killed
    # midway (the trainer's checkpoints) leaves the head that was there whole, not truncated
    data = save(tensors, metadata={"format": "pt"})
    atomic_write(os.path.join(directory, WEIGHTS_FILE), lambda f: f.write(data), "wb")
    atomic_write(os.path.join(directory, CONFIG_FILE),
                 lambda f: f.write(json.dumps(hf_eagle3_config(cfg), indent=2) + "\n"))
    return os.fspath(directory)


__all__ = ["Eagle3Config", "Eagle3Head", "init_eagle3", "load_eagle3", "save_eagle3",
           "default_aux_layers", "eagle3_config_from_hf"]
