"""The shipped target/draft pair, its tokenizer and the corpus split."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dsd_jax import models
from dsd_jax.models import corpus
from dsd_jax.models.train import (DRAFT_CONFIG, TARGET_CONFIG, check_parity, flops_per_token)


@pytest.fixture(scope="module")
def pair():
    return models.builtin()


def test_builtin_configs_and_sizes(pair):
    target, draft, tok = pair
    assert target.config.replace(dtype="float32") == TARGET_CONFIG
    assert draft.config.replace(dtype="float32") == DRAFT_CONFIG
    assert target.config.dtype == draft.config.dtype == "float32"
    assert models.num_params(target) >= 20_000_000
    assert target.config.vocab_size == draft.config.vocab_size == tok.get_vocab_size()
    for ctx in (0, 256, 2048):
        assert flops_per_token(draft.config, ctx) <= flops_per_token(target.config, ctx) / 8


def test_builtin_bf16(pair):
    t16, d16, _ = models.builtin("bfloat16")
    assert t16.embed[...].dtype == jnp.bfloat16 and d16.config.dtype == "bfloat16"
    # shipped in bf16, so the fp32 load is an exact upcast
    np.testing.assert_array_equal(np.asarray(t16.embed[...].astype(jnp.float32)),
                                  np.asarray(pair[0].embed[...]))


def test_builtin_forward_runs(pair):
    target, draft, tok = pair
    ids = tok.encode("def add(a, b):\n    return").ids
    T = len(ids)
    for m in (target, draft):
        graph, params = nnx.split(m)
        kv = models.init_kv_cache(m.config, 1, 16 + T)
        logits, _ = jax.jit(models.forward, static_argnums=0)(
            graph, params, jnp.asarray([ids], jnp.int32), jnp.arange(T, dtype=jnp.int32)[None], kv)
        assert logits.shape == (1, T, tok.get_vocab_size())
        assert bool(jnp.all(jnp.isfinite(logits)))


def test_tokenizer_round_trip(pair):
    tok = pair[2]
    assert tok.token_to_id("<|endoftext|>") == 0
    for text in ["import os\n\n\nclass Foo(Bar):\n    def __init__(self, x=1):\n\tpass\n",
                 "s = 'h\u00e9llo w\u00f6rld \u2603 \U0001f600'  # unicode\r\n", "   \n\n", ""]:
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text
    assert tok.decode(tok.encode("x = 1<|endoftext|>y").ids, skip_special_tokens=False).endswith("y")


def test_corpus_split_deterministic_and_disjoint():
    train, held = corpus.split_files()
    train2, held2 = corpus.split_files()
    assert (train, held) == (train2, held2)
    assert not set(train) & set(held)
    assert len(held) > 0 and len(train) > 10 * len(held)
    assert set(train) | set(held) == set(corpus.all_files())
    assert not any("/test/" in f or f.startswith(("test/", "site-packages/")) for f in train + held)
    # the split is by relative path only, so a module never moves when others appear
    assert all((corpus._heldout_key(f) < corpus.HELDOUT_FRACTION) == (f in held) for f in train + held)


def test_heldout_prompts_reproducible():
    a = models.heldout_prompts(8, seed=1)
    assert a == models.heldout_prompts(8, seed=1)
    assert a != models.heldout_prompts(8, seed=2)
    assert all(isinstance(p, str) and p.lstrip().startswith(("def", "class", "async", "@")) for p in a)


@pytest.mark.parametrize("cfg_kwargs", [{}, {"model_type": "qwen3", "qk_norm": True,
                                             "tie_word_embeddings": False},
                                        {"model_type": "qwen2", "qkv_bias": True}])
def test_training_forward_matches_model_forward(cfg_kwargs):
    cfg = models.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=True)
    check_parity(models.init_model(cfg.replace(**cfg_kwargs), seed=2))
