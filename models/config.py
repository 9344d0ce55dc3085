"""Model hyper-parameters for the decoder family (Llama 3.x, Qwen2/2.5, Qwen3)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    model_type: str = "llama"
    rope_theta: float = 10000.0
    # Llama 3 frequency scaling as a tuple of (key, value) pairs so the config stays hashable.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2/2.5
    qk_norm: bool = False  # Qwen3
    max_position_embeddings: int = 4096
    dtype: str = "float32"  # parameter and activation dtype

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["rope_scaling"] = self.rope_scaling_dict
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        if d.get("rope_scaling"):
            d["rope_scaling"] = tuple(sorted(d["rope_scaling"].items()))
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: dict, dtype: str = "float32") -> "ModelConfig":
        """Builds a config from a Hugging Face `config.json` dict."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r} in config.json; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        try:
            num_heads = int(hf["num_attention_heads"])
            hidden = int(hf["hidden_size"])
            cfg = dict(
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(hf["intermediate_size"]),
                num_layers=int(hf["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
                head_dim=int(hf.get("head_dim") or hidden // num_heads),
            )
        except KeyError as e:
            raise ValueError(f"config.json is missing required field {e.args[0]!r}") from None
        # Features this model family does not implement: refuse rather than load wrong numbers.
        if hf.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r} (supported: silu)")
        if hf.get("mlp_bias"):
            raise ValueError("unsupported: mlp_bias=true")
        if model_type != "qwen2" and hf.get("attention_bias"):
            raise ValueError(f"unsupported: attention_bias=true for {model_type} (o_proj bias)")
        if hf.get("use_sliding_window"):
            raise ValueError("unsupported: use_sliding_window=true (sliding-window attention)")
        scaling = hf.get("rope_scaling") or None
        rope_theta = hf.get("rope_theta")
        rope_params = hf.get("rope_parameters")  # transformers >= 5 nests RoPE settings here
        if isinstance(rope_params, dict):
            rope_theta = rope_params.get("rope_theta", rope_theta)
            if rope_params.get("rope_type", rope_params.get("type", "default")) != "default":
                scaling = rope_params
        for src in (hf, rope_params if isinstance(rope_params, dict) else {}, scaling or {}):
            if float(src.get("partial_rotary_factor", 1.0)) != 1.0:
                raise ValueError("unsupported: partial_rotary_factor != 1")
        if scaling:
            rope_type = scaling.get("rope_type", scaling.get("type"))
            if rope_type not in ("llama3", "default"):
                raise ValueError(f"unsupported rope_scaling type {rope_type!r} (supported: llama3)")
            scaling = None if rope_type == "default" else tuple(sorted(
                (k, v) for k, v in scaling.items()
                if k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")))
            scaling = (("rope_type", "llama3"),) + scaling if scaling else None
        return cls(
            **cfg,
            model_type=model_type,
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",  # Qwen2 always has q/k/v biases (and no o_proj bias)
            qk_norm=model_type == "qwen3",
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            dtype=dtype,
        )
