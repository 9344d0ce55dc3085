"""Model hyper-parameters for the decoder family (Llama 3.x, Qwen2/2.5, Qwen3)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax.numpy as jnp
import numpy as np

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
               "num_kv_heads", "head_dim", "max_position_embeddings")
_BOOL_FIELDS = ("tie_word_embeddings", "qkv_bias", "qk_norm")
# The llama3 RoPE scaling keys `transformer.rope_inv_freq` reads. A ModelConfig built without
# the last three gets Llama 3.1's values (`LLAMA3_DEFAULTS`, what dsd_jax always used: saved
# checkpoints keep their meaning); a config.json gets transformers' resolution (`hf_rope`).
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_MISSING = object()


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value) -> str:
    return "null" if value is None else f"{value!r} ({type(value).__name__})"


def hf_field(hf: dict, name: str, kind: type, default: Any = _MISSING, null_default: bool = False,
             where: str = "config.json"):
    """`hf[name]` converted to `kind` (int, float or bool), or a ValueError naming the field
    when it is missing (and has no `default`) or of the wrong type. Only an integral number
    converts to int (a string or 3.5 would otherwise be truncated or crash without a name).
    null_default: a null value means `default` (HF derives these fields when null)."""
    value = hf.get(name, _MISSING)
    if value is _MISSING or (value is None and null_default):
        if default is _MISSING:
            raise ValueError(f"{where} is missing required field {name!r}")
        return default
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: {name} must be true or false, got {_shown(value)}")
    if kind is int:
        if _is_int(value) or (_is_real(value) and float(value).is_integer()):
            return int(value)
        raise ValueError(f"{where}: {name} must be an integer, got {_shown(value)}")
    if _is_real(value):
        return float(value)
    raise ValueError(f"{where}: {name} must be a finite number, got {_shown(value)}")


def check_rope_scaling(value, where: str = "rope_scaling") -> tuple[tuple[str, Any], ...] | None:
    """`rope_scaling` in its canonical form: None (no scaling), or the sorted (key, value)
    pairs of a llama3 scaling with all of `LLAMA3_ROPE_KEYS` (missing ones filled from
    `LLAMA3_DEFAULTS`, so every reader sees the same resolved values). Any other RoPE type
    is a ValueError: the transformer would compute it as no scaling, i.e. silently wrong
    positions for a long-context model. where: the field named in messages."""
    if value is None:
        return None
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                        for p in value):
        d = dict(value)
    elif isinstance(value, dict):
        d = dict(value)
    else:
        raise ValueError(f"{where} must be null or a dict of llama3 RoPE scaling settings, got "
                         f"{value!r}")
    if "type" in d:  # the legacy spelling of rope_type
        legacy = d.pop("type")
        if d.setdefault("rope_type", legacy) != legacy:
            raise ValueError(f"{where} gives rope_type {d['rope_type']!r} and type {legacy!r}")
    if not d or d.get("rope_type") == "default":
        return None
    if d.get("rope_type") != "llama3":
        raise ValueError(f"unsupported {where} type {d.get('rope_type')!r} (supported: llama3) "
                         f"in {where} {value!r}")
    unknown = sorted(set(d) - {"rope_type", *LLAMA3_ROPE_KEYS})
    if unknown:
        raise ValueError(f"{where}: unknown llama3 key(s) {unknown}; known: "
                         f"{', '.join(LLAMA3_ROPE_KEYS)}")
    if "factor" not in d:
        raise ValueError(f"{where}: a llama3 scaling needs a 'factor', got {value!r}")
    d = {**LLAMA3_DEFAULTS, **d}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if not (_is_real(d[key]) and d[key] > 0):
            raise ValueError(f"{where}: {key} must be a positive finite number, got {_shown(d[key])}")
        if isinstance(d[key], np.generic):  # a numpy float: a Python one (a saved config.json is JSON)
            d[key] = float(d[key])
    # rope_inv_freq interpolates between the two wavelength bounds: divides by high - low.
    if not d["high_freq_factor"] > d["low_freq_factor"]:
        raise ValueError(f"{where}: high_freq_factor ({d['high_freq_factor']}) must exceed "
                         f"low_freq_factor ({d['low_freq_factor']})")
    old_len = d["original_max_position_embeddings"]
    if not (_is_int(old_len) and old_len > 0):
        raise ValueError(f"{where}: original_max_position_embeddings must be a positive integer, "
                         f"got {_shown(old_len)}")
    if isinstance(old_len, np.generic):
        d["original_max_position_embeddings"] = int(old_len)
    return tuple(sorted(d.items()))


def _rope_block(hf: dict, block: dict, where: str) -> tuple[float, tuple | None]:
    """(rope_theta, canonical scaling) of one RoPE block of config.json, as transformers 5
    standardises it (`RotaryEmbeddingConfigMixin.standardize_rope_params`)."""
    top_theta = hf_field(hf, "rope_theta", float, 10000.0, null_default=True)
    theta = hf_field(block, "rope_theta", float, top_theta, null_default=True, where=where)
    # rope_theta and partial_rotary_factor are read apart; transformers ignores other extra keys
    d = {k: v for k, v in block.items() if k in ("rope_type", "type", *LLAMA3_ROPE_KEYS)}
    if d.get("rope_type", d.get("type")) == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            if key not in d:  # transformers raises a KeyError; no guessed default
                raise ValueError(f"{where}: a llama3 RoPE scaling needs {key!r}, got {block!r}")
        if "original_max_position_embeddings" in hf:  # transformers: the top-level one wins
            d["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
        elif "original_max_position_embeddings" not in d:
            if "max_position_embeddings" not in hf:
                raise ValueError(f"{where}: a llama3 RoPE scaling needs original_max_position_embeddings "
                                 "(or max_position_embeddings, which transformers takes for it)")
            d["original_max_position_embeddings"] = hf["max_position_embeddings"]
    return theta, check_rope_scaling(d, where)


def hf_rope(hf: dict) -> tuple[float, tuple | None]:
    """(rope_theta, canonical llama3 scaling or None) of a config.json, resolved as
    transformers 5 does: the block is `rope_scaling` when non-empty, else `rope_parameters`
    (its `rope_theta` first, then the top-level one, then 10000); a llama3 block's
    `original_max_position_embeddings` is the top-level one if present, else its own, else
    `max_position_embeddings`. Both blocks given and resolving differently is an error:
    transformers would silently take rope_scaling, which may be the stale one."""
    resolved = {}
    for name in ("rope_scaling", "rope_parameters"):
        block = hf.get(name)
        if block is not None and not isinstance(block, dict):
            raise ValueError(f"config.json: {name} must be null or an object, got {block!r}")
        if block:
            resolved[name] = _rope_block(hf, block, f"config.json {name}")
    if len(set(resolved.values())) > 1:
        shown = "; ".join(f"{name} gives rope_theta={theta}, scaling={dict(s) if s else None}"
                          for name, (theta, s) in resolved.items())
        raise ValueError(f"config.json: rope_scaling and rope_parameters disagree ({shown}); "
                         "transformers would use rope_scaling: make them agree or remove one")
    if not resolved:
        return _rope_block(hf, {}, "config.json")
    return next(iter(resolved.values()))


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
    # Llama 3 frequency scaling as sorted (key, value) pairs so the config stays hashable, all
    # of LLAMA3_ROPE_KEYS resolved (a dict is accepted and converted; see `check_rope_scaling`).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2/2.5
    qk_norm: bool = False  # Qwen3
    max_position_embeddings: int = 4096
    dtype: str = "float32"  # parameter and activation dtype

    def __post_init__(self):
        if not isinstance(self.model_type, str) or self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if not isinstance(self.dtype, str) or self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        # Type checks name the field: a null or a string would otherwise fail far from here.
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {_shown(value)}")
            object.__setattr__(self, name, int(value))  # numpy ints: one canonical (hashable, JSON) form
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not _is_real(value) or value < 0 or (name == "rope_theta" and value == 0):
                raise ValueError(f"{name} must be a {'positive' if name == 'rope_theta' else 'non-negative'} "
                                 f"finite number, got {_shown(value)}")
            if isinstance(value, np.generic):  # a numpy float: a Python one (a saved config.json is JSON)
                object.__setattr__(self, name, float(value))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {_shown(getattr(self, name))}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        object.__setattr__(self, "rope_scaling", check_rope_scaling(self.rope_scaling))

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
        if not isinstance(d, dict):
            raise ValueError(f"a ModelConfig dict must be a JSON object, got {type(d).__name__}")
        d = dict(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**d)  # __post_init__ checks every field, rope_scaling (a dict here) included

    @classmethod
    def from_hf(cls, hf: dict, dtype: str = "float32") -> "ModelConfig":
        """Builds a config from a Hugging Face `config.json` dict."""
        if not isinstance(hf, dict):
            raise ValueError(f"config.json must hold a JSON object, got {type(hf).__name__}")
        model_type = hf.get("model_type")
        if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r} in config.json; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        num_heads = hf_field(hf, "num_attention_heads", int)
        hidden = hf_field(hf, "hidden_size", int)
        if num_heads <= 0:
            raise ValueError(f"config.json: num_attention_heads must be positive, got {num_heads}")
        cfg = dict(
            vocab_size=hf_field(hf, "vocab_size", int),
            hidden_size=hidden,
            intermediate_size=hf_field(hf, "intermediate_size", int),
            num_layers=hf_field(hf, "num_hidden_layers", int),
            num_heads=num_heads,
            num_kv_heads=hf_field(hf, "num_key_value_heads", int, num_heads, null_default=True),
            # transformers' Qwen3Config defaults head_dim to 128, not hidden / heads
            head_dim=hf_field(hf, "head_dim", int, 128 if model_type == "qwen3" else hidden // num_heads,
                              null_default=True),
        )
        # Features this model family does not implement: refuse rather than load wrong numbers.
        if hf.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r} (supported: silu)")
        if hf.get("mlp_bias"):
            raise ValueError("unsupported: mlp_bias=true")
        if model_type != "qwen2" and hf.get("attention_bias"):
            raise ValueError(f"unsupported: attention_bias=true for {model_type} (o_proj bias)")
        if hf.get("use_sliding_window"):
            raise ValueError("unsupported: use_sliding_window=true (sliding-window attention)")
        rope_theta, scaling = hf_rope(hf)
        for src, where in ((hf, "config.json"), (hf.get("rope_scaling") or {}, "config.json rope_scaling"),
                           (hf.get("rope_parameters") or {}, "config.json rope_parameters")):
            if hf_field(src, "partial_rotary_factor", float, 1.0, where=where) != 1.0:
                raise ValueError("unsupported: partial_rotary_factor != 1")
        return cls(
            **cfg,
            model_type=model_type,
            rope_theta=rope_theta,
            rope_scaling=scaling,
            rms_norm_eps=hf_field(hf, "rms_norm_eps", float, 1e-6),
            # transformers reads a null tie_word_embeddings as false
            tie_word_embeddings=hf_field(hf, "tie_word_embeddings", bool, False, null_default=True),
            qkv_bias=model_type == "qwen2",  # Qwen2 always has q/k/v biases (and no o_proj bias)
            qk_norm=model_type == "qwen3",
            max_position_embeddings=hf_field(hf, "max_position_embeddings", int, 4096),
            dtype=dtype,
        )
