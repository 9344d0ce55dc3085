"""The decoder family as Flax NNX modules, and the pure forward the engine compiles.

One module covers Llama 3.x (incl. llama3 RoPE scaling), Qwen2/2.5 (qkv bias) and
Qwen3 (q/k RMSNorm): GQA, RoPE (rotate-half convention, as Hugging Face), RMSNorm,
SwiGLU, tied or untied embeddings.

The KV cache is a `KVCache` of per-layer arrays laid out `[slots, Hkv, S, D]`
(measured on XLA:CPU, this beats `[slots, S, Hkv*D]` by >10x for attention). Each
layer writes and reads its cache through `kernels.attend_and_write`: new entries are
scattered at their absolute positions with `mode="drop"` (a position past the buffer
is dropped instead of being clamped onto a valid entry), in place, and attention reads
only the live context of the rows it serves, so a step's cost does not follow the
cache's capacity.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax import kernels
from .config import LLAMA3_ROPE_KEYS, ModelConfig


class KVCache(NamedTuple):
    k: tuple  # per layer: [slots, Hkv, S, D]
    v: tuple

    @property
    def num_slots(self) -> int:
        return self.k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]


def init_kv_cache(cfg: ModelConfig, num_slots: int, capacity: int) -> KVCache:
    shape = (num_slots, cfg.num_kv_heads, capacity, cfg.head_dim)
    zeros = lambda: tuple(jnp.zeros(shape, cfg.jnp_dtype) for _ in range(cfg.num_layers))
    return KVCache(zeros(), zeros())


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [head_dim/2], with Llama 3 scaling when configured."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    scaling = cfg.rope_scaling_dict
    if scaling:
        if scaling.get("rope_type") != "llama3":  # ModelConfig refuses it; never compute it as unscaled
            raise ValueError(f"unsupported rope_scaling {scaling!r} (supported: llama3)")
        # ModelConfig holds every key resolved (its defaults live in config.check_rope_scaling)
        factor, low, high, old_len = (scaling[k] for k in LLAMA3_ROPE_KEYS)
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = np.where(wavelen > low_wavelen, inv_freq / factor,
                            np.where(wavelen < high_wavelen, inv_freq, smoothed))
    return inv_freq.astype(np.float32)


def rope_cos_sin(cfg: ModelConfig, positions):
    """cos, sin [B, T, head_dim] for integer positions [B, T] (or [1, T])."""
    freqs = positions[..., None].astype(jnp.float32) * jnp.asarray(rope_inv_freq(cfg))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(cfg.jnp_dtype), jnp.sin(emb).astype(cfg.jnp_dtype)


def apply_rope(x, cos, sin):
    """x: [B, T, H, D]; cos/sin: [B, T, D] (rotate-half layout)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


def rms_norm(x, weight, eps):
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


def _normal(rngs, shape, dtype, std=0.02):
    return nnx.Param((std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype))


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dt = cfg.jnp_dtype
        d, hq, hkv, hd, f = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size)
        self.attn_norm = nnx.Param(jnp.ones((d,), dt))
        self.wq = _normal(rngs, (d, hq * hd), dt)
        self.wk = _normal(rngs, (d, hkv * hd), dt)
        self.wv = _normal(rngs, (d, hkv * hd), dt)
        self.wo = _normal(rngs, (hq * hd, d), dt)
        if cfg.qkv_bias:
            self.bq = nnx.Param(jnp.zeros((hq * hd,), dt))
            self.bk = nnx.Param(jnp.zeros((hkv * hd,), dt))
            self.bv = nnx.Param(jnp.zeros((hkv * hd,), dt))
        if cfg.qk_norm:
            self.q_norm = nnx.Param(jnp.ones((hd,), dt))
            self.k_norm = nnx.Param(jnp.ones((hd,), dt))
        self.mlp_norm = nnx.Param(jnp.ones((d,), dt))
        self.w_gate = _normal(rngs, (d, f), dt)
        self.w_up = _normal(rngs, (d, f), dt)
        self.w_down = _normal(rngs, (f, d), dt)

    def qkv(self, cfg: ModelConfig, x, cos, sin, wqkv=None):
        """Rotated queries [B, T, Hq, D] and keys, values [B, T, Hkv, D] of x [B, T, d].
        `wqkv`: wq|wk|wv concatenated along their outputs, one matmul for the three (what
        the device check's floors time beside the three)."""
        B, T, _ = x.shape
        h = rms_norm(x, self.attn_norm[...], cfg.rms_norm_eps)
        if wqkv is None:
            q, k, v = h @ self.wq[...], h @ self.wk[...], h @ self.wv[...]
        else:
            q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
            q, k, v = jnp.split(h @ wqkv, [q_width, q_width + kv_width], axis=-1)
        if cfg.qkv_bias:
            q, k, v = q + self.bq[...], k + self.bk[...], v + self.bv[...]
        q = q.reshape(B, T, cfg.num_heads, cfg.head_dim)
        k = k.reshape(B, T, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(B, T, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = rms_norm(q, self.q_norm[...], cfg.rms_norm_eps)
            k = rms_norm(k, self.k_norm[...], cfg.rms_norm_eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, cfg: ModelConfig, x, attn, w_gate_up=None):
        """Output projection of the attention [B, T, Hq, D], residual, then the SwiGLU MLP.
        `w_gate_up`: w_gate|w_up concatenated, one matmul for the two (as `qkv`'s `wqkv`)."""
        B, T, _ = x.shape
        x = x + attn.reshape(B, T, -1) @ self.wo[...]
        h = rms_norm(x, self.mlp_norm[...], cfg.rms_norm_eps)
        if w_gate_up is None:
            gate, up = h @ self.w_gate[...], h @ self.w_up[...]
        else:
            gate, up = jnp.split(h @ w_gate_up, 2, axis=-1)
        return x + (jax.nn.silu(gate) * up) @ self.w_down[...]

    def __call__(self, cfg: ModelConfig, x, cos, sin, positions, k_cache, v_cache, rows, attn_backend):
        q, k, v = self.qkv(cfg, x, cos, sin)
        attn, k_cache, v_cache = kernels.attend_and_write(q, k, v, positions, k_cache, v_cache, rows,
                                                          backend=attn_backend)
        return self.finish(cfg, x, attn), k_cache, v_cache


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        dt = cfg.jnp_dtype
        self.embed = _normal(rngs, (cfg.vocab_size, cfg.hidden_size), dt)
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = nnx.Param(jnp.ones((cfg.hidden_size,), dt))
        if not cfg.tie_word_embeddings:
            self.lm_head = _normal(rngs, (cfg.hidden_size, cfg.vocab_size), dt)

    def __call__(self, tokens, positions, kv: KVCache, rows=None, attn_backend: str = "auto",
                 aux_layers: tuple[int, ...] = (), head: bool = True):
        """Runs T new tokens per row through the model, writing their KV entries.

        tokens, positions: [B, T] int32. A position < 0 marks padding: its KV write is
        dropped and its output is garbage the caller ignores. Query at position p sees
        cache entries 0..p of its row (the new ones included), so per-sequence lengths
        and causality inside the new window both follow from `positions`.
        rows: [B] int32 cache rows of the batch rows (None: rows 0..B-1, a static slice).
        aux_layers: static; layer indices whose residual inputs are also returned (EAGLE-3
        reads layers 2, L//2, L-3). Empty (the default) traces no extra output.
        head: static; False returns the last layer's output [B, T, d] in place of the
        logits, for a caller that applies `logits` to pieces of it (`step.prefill` scoring
        prompts, which would otherwise hold [B, T, V] at once).
        Returns (float32 logits [B, T, V], updated KVCache), plus, with aux_layers, the
        residual inputs concatenated [B, T, len(aux_layers) * d] in the model's dtype.
        """
        cfg = self.config
        cos, sin = rope_cos_sin(cfg, jnp.maximum(positions, 0))

        x = jnp.take(self.embed[...], tokens, axis=0)
        new_k, new_v, aux = [], [], {}
        for i, (layer, k_cache, v_cache) in enumerate(zip(self.layers, kv.k, kv.v)):
            if i in aux_layers:
                aux[i] = x
            x, k_cache, v_cache = layer(cfg, x, cos, sin, positions, k_cache, v_cache, rows,
                                        attn_backend)
            new_k.append(k_cache)
            new_v.append(v_cache)
        out = self.logits(x) if head else x, KVCache(tuple(new_k), tuple(new_v))
        if not aux_layers:
            return out
        return out + (jnp.concatenate([aux[i] for i in aux_layers], axis=-1),)

    def logits(self, x):
        """Final norm and LM head: float32 logits [B, T, V] of hidden states [B, T, d]."""
        x = rms_norm(x, self.final_norm[...], self.config.rms_norm_eps)
        if self.config.tie_word_embeddings:  # contract with embed [V, d] directly, no transpose
            return jnp.einsum("btd,vd->btv", x, self.embed[...], preferred_element_type=jnp.float32)
        return jnp.matmul(x, self.lm_head[...], preferred_element_type=jnp.float32)


def init_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return Transformer(cfg, rngs=nnx.Rngs(seed))


def forward(graphdef, params, tokens, positions, kv: KVCache, rows=None, attn_backend="auto",
            aux_layers: tuple[int, ...] = (), head: bool = True):
    """Pure forward over `nnx.split(model)`; see `Transformer.__call__`."""
    return nnx.merge(graphdef, params)(tokens, positions, kv, rows=rows, attn_backend=attn_backend,
                                       aux_layers=aux_layers, head=head)


def logits_of(graphdef, params, x):
    """`Transformer.logits` of a split model: float32 logits [B, T, V] of last-layer outputs [B, T, d]
    (what `forward(..., head=False)` returns)."""
    return nnx.merge(graphdef, params).logits(x)


def config_of(graphdef, params) -> ModelConfig:
    """The `ModelConfig` of a split model (a static attribute: free inside a trace)."""
    return nnx.merge(graphdef, params).config


def embedding_of(graphdef, params):
    """The token embedding table [V, d] of a split model (EAGLE heads share it)."""
    return nnx.merge(graphdef, params).embed[...]


def num_params(model: Transformer) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
