"""RoPE settings of a Hugging Face config.json read as transformers 5 reads them.

Each config is written to a tmp dir and loaded with `transformers.AutoConfig` (what
`from_pretrained` does); its rotary embedding's inverse frequencies are the reference.
No model weights: these run in well under a second each.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from dsd_jax.models import ModelConfig  # noqa: E402
from dsd_jax.models.transformer import rope_inv_freq  # noqa: E402

BASE = dict(model_type="llama", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32}
NO_ORIG = {k: v for k, v in L3.items() if k != "original_max_position_embeddings"}


def _hf_rope(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    rot = LlamaRotaryEmbedding(hf)
    return rot.inv_freq.numpy(), hf.rope_parameters["rope_theta"]


CASES = {
    "v4 layout": dict(rope_theta=500000.0, rope_scaling=L3),
    "v5 layout": dict(rope_parameters={**L3, "rope_theta": 500000.0}),
    "both agreeing (save_hf)": dict(rope_theta=5e5, rope_scaling=L3,
                                    rope_parameters={**L3, "rope_theta": 5e5}),
    "theta inside rope_scaling": dict(rope_scaling={**L3, "rope_theta": 500000.0}),
    "no original_max (scaling)": dict(rope_scaling=NO_ORIG),  # from max_position_embeddings
    "no original_max (parameters)": dict(rope_parameters={**NO_ORIG, "rope_theta": 1e6}),
    "top-level original_max wins": dict(original_max_position_embeddings=16, rope_scaling=L3),
    "legacy type key": dict(rope_scaling={("type" if k == "rope_type" else k): v for k, v in L3.items()}),
    "empty rope_scaling": dict(rope_scaling={}, rope_parameters={**L3, "rope_theta": 1e6}),
    "default with factor": dict(rope_scaling={"rope_type": "default", "factor": 4.0}),
    "top-level theta only": dict(rope_theta=1000.0),
    "qwen2 no original_max": dict(model_type="qwen2", rope_scaling=NO_ORIG),
    "qwen3 v5 no original_max": dict(model_type="qwen3", head_dim=24,
                                     rope_parameters={**NO_ORIG, "rope_theta": 1e6}),
}


@pytest.mark.parametrize("extra", list(CASES.values()), ids=list(CASES))
def test_rope_resolved_as_transformers(tmp_path, extra):
    cfg = {**BASE, **extra}
    hf_inv, hf_theta = _hf_rope(tmp_path, cfg)
    ours = ModelConfig.from_hf(cfg)
    assert ours.rope_theta == hf_theta
    np.testing.assert_allclose(rope_inv_freq(ours), hf_inv, rtol=1e-6)


@pytest.mark.parametrize("extra, match", [
    (dict(rope_scaling={k: v for k, v in L3.items() if k != "low_freq_factor"}),
     "config.json rope_scaling: a llama3 RoPE scaling needs 'low_freq_factor'"),
    (dict(rope_parameters={k: v for k, v in L3.items() if k != "high_freq_factor"}),
     "config.json rope_parameters: a llama3 RoPE scaling needs 'high_freq_factor'"),
    (dict(rope_scaling={k: v for k, v in L3.items() if k != "factor"}),
     "config.json rope_scaling: a llama3 RoPE scaling needs 'factor'"),
])
def test_missing_llama3_key_is_an_error_as_in_transformers(tmp_path, extra, match):
    cfg = {**BASE, **extra}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KeyError):  # transformers refuses it too: no default to guess
        LlamaRotaryEmbedding(transformers.AutoConfig.from_pretrained(tmp_path))
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(cfg)


@pytest.mark.parametrize("extra", [
    dict(rope_theta=500000.0, rope_scaling=L3, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    dict(rope_scaling=L3, rope_parameters={**L3, "factor": 2.0, "rope_theta": 1e4}),
    dict(rope_scaling={"rope_type": "default"}, rope_parameters={**L3, "rope_theta": 1e4}),
])
def test_disagreeing_rope_blocks_are_an_error(extra):
    """transformers silently takes rope_scaling; either block may be the stale one."""
    with pytest.raises(ValueError, match="rope_scaling and rope_parameters disagree"):
        ModelConfig.from_hf({**BASE, **extra})


def test_model_config_holds_resolved_llama3_values():
    """A ModelConfig built without the optional llama3 keys gets Llama 3.1's values, stored,
    so rope_inv_freq, save and save_hf all see the same numbers."""
    cfg = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert cfg.rope_scaling_dict == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
