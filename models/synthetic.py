"""Real model shapes with random weights, to profile latency without downloading weights.

    target = models.synthetic("llama-3.1-8b", dtype="bfloat16")
    draft = models.synthetic("llama-3.2-1b", dtype="bfloat16", seed=1)

Each named config is the published Hugging Face `config.json` of that model (vocabulary,
widths, heads, RoPE, tied embeddings, Qwen2 q/k/v biases, Qwen3 q/k norms), so a step
costs what the real model's step costs; only the weights are random (normal, std 0.02,
as `init_model`). `KNOWN_NUM_PARAMS` holds the published totals, which
`synthetic_num_params` reproduces from abstract shapes (nothing allocated). The "tiny-*"
configs keep each family's features at toy sizes, for CPU tests.
"""

from __future__ import annotations

import jax
from flax import nnx

from .config import ModelConfig
from .transformer import Transformer, init_model

_LLAMA31_ROPE = (("rope_type", "llama3"), ("factor", 8.0), ("high_freq_factor", 4.0),
                 ("low_freq_factor", 1.0), ("original_max_position_embeddings", 8192))
_LLAMA32_ROPE = (("rope_type", "llama3"), ("factor", 32.0), ("high_freq_factor", 4.0),
                 ("low_freq_factor", 1.0), ("original_max_position_embeddings", 8192))


def _llama(vocab, hidden, inter, layers, heads, kv, head_dim, rope, tied, **kw):
    return dict(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                rope_theta=500000.0, rope_scaling=rope, rms_norm_eps=1e-5,
                tie_word_embeddings=tied, max_position_embeddings=131072, **kw)


def _qwen(model_type, vocab, hidden, inter, layers, heads, kv, head_dim, tied, max_pos=40960, **kw):
    return dict(model_type=model_type, vocab_size=vocab, hidden_size=hidden,
                intermediate_size=inter, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                head_dim=head_dim, rope_theta=1000000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=tied, qkv_bias=model_type == "qwen2",
                qk_norm=model_type == "qwen3", max_position_embeddings=max_pos, **kw)


# name -> ModelConfig fields (without dtype), from each model's config.json on the Hub
SYNTHETIC_CONFIGS: dict[str, dict] = {
    "llama-3.1-8b": _llama(128256, 4096, 14336, 32, 32, 8, 128, _LLAMA31_ROPE, False),
    "llama-3.2-1b": _llama(128256, 2048, 8192, 16, 32, 8, 64, _LLAMA32_ROPE, True),
    "llama-3.2-3b": _llama(128256, 3072, 8192, 28, 24, 8, 128, _LLAMA32_ROPE, True),
    "qwen2.5-7b": _qwen("qwen2", 152064, 3584, 18944, 28, 28, 4, 128, False, max_pos=131072),
    "qwen2.5-0.5b": _qwen("qwen2", 151936, 896, 4864, 24, 14, 2, 64, True, max_pos=32768),
    "qwen2.5-1.5b": _qwen("qwen2", 151936, 1536, 8960, 28, 12, 2, 128, True, max_pos=131072),
    "qwen3-8b": _qwen("qwen3", 151936, 4096, 12288, 36, 32, 8, 128, False),
    "qwen3-4b": _qwen("qwen3", 151936, 2560, 9728, 36, 32, 8, 128, True),
    "qwen3-1.7b": _qwen("qwen3", 151936, 2048, 6144, 28, 16, 8, 128, True),
    "qwen3-0.6b": _qwen("qwen3", 151936, 1024, 3072, 28, 16, 8, 128, True),
    # toy sizes with each family's features (CPU tests and `device_check --cpu-smoke`)
    "tiny-llama": _llama(512, 64, 128, 2, 4, 2, 16, _LLAMA31_ROPE, False),
    "tiny-llama-draft": _llama(512, 32, 64, 1, 2, 1, 16, _LLAMA32_ROPE, True),
    "tiny-qwen2": _qwen("qwen2", 512, 64, 128, 2, 4, 2, 16, False),
    "tiny-qwen3": _qwen("qwen3", 512, 64, 128, 2, 4, 2, 16, False),
    "tiny-qwen3-draft": _qwen("qwen3", 512, 32, 64, 1, 2, 1, 16, True),
}

# Published parameter totals of the Hub checkpoints (tied embeddings counted once).
KNOWN_NUM_PARAMS: dict[str, int] = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen3-8b": 8_190_735_360,
    "qwen3-4b": 4_022_468_096,
    "qwen3-0.6b": 596_049_920,
}


def synthetic_config(name: str, dtype: str = "bfloat16", **overrides) -> ModelConfig:
    """The `ModelConfig` of a named real model (see `SYNTHETIC_CONFIGS`); `overrides`
    replace fields (e.g. ``num_layers=4`` for a shallower variant)."""
    key = name.lower()
    if key not in SYNTHETIC_CONFIGS:
        raise ValueError(f"unknown synthetic model {name!r}; known: {', '.join(SYNTHETIC_CONFIGS)}")
    return ModelConfig(**{**SYNTHETIC_CONFIGS[key], "dtype": dtype, **overrides})


def synthetic(name: str, dtype: str = "bfloat16", seed: int = 0, **overrides) -> Transformer:
    """A `Transformer` with the named model's real config and random weights."""
    return init_model(synthetic_config(name, dtype, **overrides), seed=seed)


def synthetic_num_params(name_or_config) -> int:
    """Parameter count from abstract shapes (`nnx.eval_shape`: nothing is allocated)."""
    cfg = (name_or_config if isinstance(name_or_config, ModelConfig)
           else synthetic_config(name_or_config))
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
