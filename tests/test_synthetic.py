"""models.synthetic: real configs with random weights; parameter counts from abstract shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dsd_jax import models
from dsd_jax.models.synthetic import (KNOWN_NUM_PARAMS, SYNTHETIC_CONFIGS, synthetic_config,
                                      synthetic_num_params)


@pytest.mark.parametrize("name", list(KNOWN_NUM_PARAMS))
def test_real_parameter_counts(name):
    assert synthetic_num_params(name) == KNOWN_NUM_PARAMS[name]


def test_issue_totals_are_covered():
    # the totals the issue names, with the feature that decides each
    assert KNOWN_NUM_PARAMS["llama-3.1-8b"] == 8_030_261_248
    assert KNOWN_NUM_PARAMS["llama-3.2-1b"] == 1_235_814_400
    assert KNOWN_NUM_PARAMS["qwen2.5-7b"] == 7_615_616_512
    assert KNOWN_NUM_PARAMS["qwen3-8b"] == 8_190_735_360
    assert KNOWN_NUM_PARAMS["qwen3-0.6b"] == 596_049_920
    assert synthetic_config("llama-3.2-1b").tie_word_embeddings
    assert not synthetic_config("llama-3.1-8b").tie_word_embeddings
    assert synthetic_config("qwen2.5-7b").qkv_bias and not synthetic_config("qwen2.5-7b").qk_norm
    assert synthetic_config("qwen3-8b").qk_norm and not synthetic_config("qwen3-8b").qkv_bias
    assert synthetic_config("qwen3-0.6b").tie_word_embeddings
    assert synthetic_config("llama-3.1-8b").rope_scaling_dict["factor"] == 8.0


def test_counting_allocates_nothing():
    cfg = synthetic_config("llama-3.1-8b")
    abstract = nnx.eval_shape(lambda: models.Transformer(cfg, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}


def test_pairs_share_a_vocabulary():
    assert synthetic_config("llama-3.1-8b").vocab_size == synthetic_config("llama-3.2-1b").vocab_size
    assert synthetic_config("qwen3-8b").vocab_size == synthetic_config("qwen3-0.6b").vocab_size


@pytest.mark.parametrize("name", [n for n in SYNTHETIC_CONFIGS if n.startswith("tiny-")])
def test_tiny_models_build_and_run(name):
    model = models.synthetic(name, dtype="bfloat16", seed=3)
    cfg = model.config
    assert models.num_params(model) == synthetic_num_params(name)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    graph, params = nnx.split(model)
    tokens = jnp.arange(4, dtype=jnp.int32)[None]
    logits, _ = jax.jit(lambda p: models.forward(graph, p, tokens, tokens,
                                                 models.init_kv_cache(cfg, 1, 16), attn_backend="xla"))(params)
    assert logits.shape == (1, 4, cfg.vocab_size) and bool(jnp.all(jnp.isfinite(logits)))


def test_overrides_and_errors():
    assert synthetic_config("qwen3-8b", num_layers=2).num_layers == 2
    assert synthetic_config("Qwen3-8B", dtype="float32").dtype == "float32"
    with pytest.raises(ValueError, match="unknown synthetic model"):
        synthetic_config("gpt-2")


def test_cli_profile_synthetic_with_given_acceptance(tmp_path, capsys):
    import json

    from dsd_jax.cli import main
    out = tmp_path / "p.json"
    base = ["profile", "--synthetic", "tiny-llama", "--draft-synthetic", "tiny-llama-draft",
            "--speculative-config", '{"num_speculative_tokens": 1}', "--max-batch-size", "1",
            "--max-seq-len", "24", "--context-lengths", "16", "--repeats", "1", "--warmup-reps", "0",
            "--no-progress", "--out", str(out)]
    assert main(base + ["--acceptance", "0.681,0.391"]) == 0
    prof = json.loads(out.read_text())
    assert prof["acceptance"] == [0.681] and prof["ks"] == [0, 1] and prof["batch_sizes"] == [1]
    assert prof["meta"]["acceptance_source"] == "given"
    assert prof["meta"]["synthetic"] == {"target": "tiny-llama", "draft": "tiny-llama-draft",
                                         "dtype": "bfloat16"}
    assert "0.681" in capsys.readouterr().out
    two = list(base)
    two[6] = '{"num_speculative_tokens": 2}'
    two[-1] = fresh = str(tmp_path / "q.json")
    with pytest.raises(SystemExit, match="--acceptance: give a_1..a_K for every K up to 2"):
        main(two + ["--acceptance", "0.5"])
    with pytest.raises(SystemExit, match="--acceptance: values: a_2 = 0.6 exceeds a_1 = 0.5"):
        main(two + ["--acceptance", "0.5,0.6"])
    with pytest.raises(SystemExit, match="--synthetic: unknown model 'gpt-2'"):
        main(["profile", "--synthetic", "gpt-2", "--draft-synthetic", "tiny-llama-draft", "--out", fresh])
    with pytest.raises(SystemExit, match="--draft-synthetic: qwen3-0.6b is a qwen model with another "
                                         "tokenizer than tiny-llama's"):
        main(["profile", "--synthetic", "tiny-llama", "--draft-synthetic", "qwen3-0.6b",
              "--out", fresh])
    with pytest.raises(SystemExit, match="--out: .*exists; pass --overwrite"):
        main(base + ["--acceptance", "0.681"])  # before any model is built
