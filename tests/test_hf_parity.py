"""Parity of `models.load_hf` models with Hugging Face transformers (torch, CPU, fp32).

Tiny random Llama (llama3 RoPE scaling, untied), Qwen2 (qkv bias, tied) and Qwen3
(q/k norm, explicit head_dim) checkpoints, all with GQA, are written with
`save_pretrained` into tmp dirs and loaded back. Weights are re-drawn with a large
std and norm weights / biases are randomised, so attention is sharp (RoPE and
masking errors show) and every norm and bias matters.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from dsd_jax import models  # noqa: E402
from dsd_jax.models import forward, init_kv_cache, load_hf, load_tokenizer  # noqa: E402

VOCAB = 97
PROMPT_LENS = (9, 3, 14)
PREFILL_LENS = (4, 1, 8)  # then token-by-token decode up to PROMPT_LENS
CAPACITY = 24
FP32_TOL = 1e-4

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
              max_position_embeddings=128)
ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        tie_word_embeddings=False, rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(
        tie_word_embeddings=True, rope_theta=1000.0)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(
        tie_word_embeddings=False, head_dim=24, rope_theta=1000000.0)),
}


def _make_hf(arch: str, seed: int = 0):
    cfg_cls, model_cls, extra = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = cfg_cls(**COMMON, **extra, attn_implementation="eager")
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.25)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """arch -> (checkpoint dir, HF torch model)."""
    out = {}
    for arch in ARCHS:
        model = _make_hf(arch)
        path = tmp_path_factory.mktemp(arch)
        model.save_pretrained(path, safe_serialization=True)
        out[arch] = (str(path), model)
    return out


def _prompts(seed: int = 1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=n).astype(np.int32) for n in PROMPT_LENS]


def _hf_logits(model, prompts):
    """HF logits of each prompt run on its own (no padding): list of [L, V]."""
    with torch.no_grad():
        return [model(torch.tensor(p[None], dtype=torch.long)).logits[0].float().numpy()
                for p in prompts]


_fwd = jax.jit(forward, static_argnums=0)


def _batch(prompts, starts, stops):
    """Right-padded [B, T] tokens/positions for prompt[start:stop] per row; padding is -1."""
    T = max(max(b - a for a, b in zip(starts, stops)), 1)
    tokens = np.zeros((len(prompts), T), np.int32)
    positions = np.full((len(prompts), T), -1, np.int32)
    for i, (p, a, b) in enumerate(zip(prompts, starts, stops)):
        tokens[i, :b - a] = p[a:b]
        positions[i, :b - a] = np.arange(a, b)
    return jnp.asarray(tokens), jnp.asarray(positions)


def _full_forward(model, prompts):
    graphdef, params = nnx.split(model)
    kv = init_kv_cache(model.config, len(prompts), CAPACITY)
    tokens, positions = _batch(prompts, [0] * len(prompts), [len(p) for p in prompts])
    logits, _ = _fwd(graphdef, params, tokens, positions, kv)
    return [np.asarray(logits[i, :len(p)]) for i, p in enumerate(prompts)]


def _prefill_then_decode(model, prompts):
    """Prefill PREFILL_LENS as one padded batch, then decode one token per step via the cache."""
    graphdef, params = nnx.split(model)
    kv = init_kv_cache(model.config, len(prompts), CAPACITY)
    tokens, positions = _batch(prompts, [0] * len(prompts), PREFILL_LENS)
    logits, kv = _fwd(graphdef, params, tokens, positions, kv)
    out = [[np.asarray(logits[i, :n])] for i, n in enumerate(PREFILL_LENS)]
    for step in range(max(len(p) - n for p, n in zip(prompts, PREFILL_LENS))):
        pos = [n + step for n in PREFILL_LENS]
        tokens, positions = _batch(prompts, pos, [min(q + 1, len(p)) for q, p in zip(pos, prompts)])
        logits, kv = _fwd(graphdef, params, tokens, positions, kv)
        for i, (q, p) in enumerate(zip(pos, prompts)):
            if q < len(p):
                out[i].append(np.asarray(logits[i, :1]))
    return [np.concatenate(rows) for rows in out]


def _max_diff(ours, ref):
    assert [o.shape for o in ours] == [r.shape for r in ref]
    return max(float(np.max(np.abs(o - r))) for o, r in zip(ours, ref))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_match_hf(checkpoints, arch):
    path, hf_model = checkpoints[arch]
    model = load_hf(path)
    cfg = model.config
    assert cfg.model_type == arch and cfg.num_kv_heads == 2 and cfg.num_heads == 4
    assert cfg.tie_word_embeddings == (arch == "qwen2")
    assert cfg.qkv_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    if arch == "qwen3":
        assert cfg.head_dim == 24
    if arch == "llama":
        assert cfg.rope_scaling_dict["rope_type"] == "llama3"

    prompts = _prompts()
    ref = _hf_logits(hf_model, prompts)
    assert max(float(np.abs(r).max()) for r in ref) > 1.0  # weights big enough to be a real test
    full = _max_diff(_full_forward(model, prompts), ref)
    decode = _max_diff(_prefill_then_decode(model, prompts), ref)
    print(f"{arch}: max |logit diff| full={full:.2e} prefill+decode={decode:.2e}")
    assert full < FP32_TOL, full
    assert decode < FP32_TOL, decode


def test_sharded_checkpoint_loads_identically(checkpoints, tmp_path):
    path, hf_model = checkpoints["llama"]
    hf_model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    assert not os.path.exists(tmp_path / "model.safetensors")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
    single, sharded = nnx.state(load_hf(path)), nnx.state(load_hf(tmp_path))
    assert jax.tree.structure(single) == jax.tree.structure(sharded)
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_bfloat16_model_close_to_float32(checkpoints, arch):
    path, hf_model = checkpoints[arch]
    m32, m16 = load_hf(path), load_hf(path, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(m16, nnx.Param))
    assert all(x.dtype == jnp.bfloat16 for x in leaves)
    prompts = _prompts()
    ref = _full_forward(m32, prompts)
    # Tolerance: bf16 keeps 8 mantissa bits (rounding 2^-9 ~ 0.2% per op). With these
    # deliberately sharp random weights (attention scores ~10-20), those errors move the
    # softmax and compound to ~2-5% of the logit scale: HF's own bf16 twin shows the same
    # error. So the bound is relative to HF's bf16-vs-fp32 error on the same prompts
    # (x1.5, as the rounding points differ) and, absolutely, 10% of the largest |logit|.
    hf16 = _hf_logits(copy.deepcopy(hf_model).to(torch.bfloat16), prompts)
    hf_err = _max_diff(hf16, ref)
    scale = max(float(np.abs(r).max()) for r in ref)
    runs = [("full", _full_forward)] + ([("prefill+decode", _prefill_then_decode)]
                                        if arch == "llama" else [])  # same code path: once
    for mode, run in runs:
        ours = run(m16, prompts)
        assert all(o.dtype == np.float32 and np.isfinite(o).all() for o in ours)
        diff = _max_diff(ours, ref)
        print(f"{arch} bf16 vs fp32 ({mode}): max |diff|={diff:.3f} (HF bf16: {hf_err:.3f}), "
              f"logit scale={scale:.2f}")
        assert diff <= 1.5 * hf_err + 1e-2 and diff < 0.1 * scale, (diff, hf_err, scale)


def test_bfloat16_checkpoint_loads(checkpoints, tmp_path):
    path, hf_model = checkpoints["qwen3"]
    _make_hf("qwen3").to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
    assert load_hf(tmp_path).config.dtype == "bfloat16"  # "auto": the checkpoint's own
    m = load_hf(tmp_path, dtype="float32")  # bf16 on disk -> fp32 params, exactly the bf16-rounded values
    ref = load_hf(path)
    w, w_ref = np.asarray(m.layers[0].wq[...]), np.asarray(ref.layers[0].wq[...])
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w, w_ref.astype(jnp.bfloat16).astype(np.float32))


# ---- errors ------------------------------------------------------------------------------

def _copy(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def test_unknown_model_type(checkpoints, tmp_path):
    d = _copy(checkpoints["llama"][0], tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"gpt2.*llama, qwen2, qwen3"):
        load_hf(d)


def _rewrite_weights(d, fn):
    tensors = load_file(d / "model.safetensors")
    fn(tensors)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(checkpoints, tmp_path):
    d = _copy(checkpoints["qwen2"][0], tmp_path / "ckpt")
    _rewrite_weights(d, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.bias'"):
        load_hf(d)


def test_untied_model_without_lm_head(checkpoints, tmp_path):
    d = _copy(checkpoints["qwen3"][0], tmp_path / "ckpt")
    _rewrite_weights(d, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"missing tensor 'lm_head\.weight'"):
        load_hf(d)


def test_tied_model_with_a_stored_lm_head(checkpoints, tmp_path):
    """A tied checkpoint that also stores lm_head.weight: a copy of the embedding loads; a
    different one is what transformers would use, so loading it tied is an error."""
    d = _copy(checkpoints["qwen2"][0], tmp_path / "ckpt")  # tied
    tied = load_hf(d)
    _rewrite_weights(d, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].copy()))
    _assert_same_params(load_hf(d), tied)
    _rewrite_weights(d, lambda t: t.__setitem__("lm_head.weight", t["lm_head.weight"] + 1.0))
    with pytest.raises(ValueError, match=r"tie_word_embeddings=true but its 'lm_head\.weight' differs from "
                                         r"'model\.embed_tokens\.weight' \(transformers would use"):
        load_hf(d)


def test_shape_mismatch(checkpoints, tmp_path):
    d = _copy(checkpoints["llama"][0], tmp_path / "ckpt")
    name = "model.layers.0.mlp.up_proj.weight"
    _rewrite_weights(d, lambda t: t.__setitem__(name, np.zeros((95, 64), np.float32)))
    with pytest.raises(ValueError, match=r"up_proj\.weight.*\(95, 64\).*expected \(96, 64\)"):
        load_hf(d)


def test_unexpected_tensor_is_an_error(checkpoints, tmp_path):
    d = _copy(checkpoints["llama"][0], tmp_path / "ckpt")
    _rewrite_weights(d, lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.bias",
                                                np.zeros((64,), np.float32)))
    with pytest.raises(ValueError, match=r"o_proj\.bias"):
        load_hf(d)


def test_bad_paths(checkpoints, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        load_hf(tmp_path / "file")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(empty)
    shutil.copy(os.path.join(checkpoints["llama"][0], "config.json"), empty / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf(empty)
    with pytest.raises(ValueError, match="dtype"):
        load_hf(checkpoints["llama"][0], dtype="float16")


def test_load_tokenizer(checkpoints, tmp_path):
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

    path = checkpoints["llama"][0]
    assert load_tokenizer(path) is None
    d = _copy(path, tmp_path / "ckpt")
    tok = Tokenizer(tok_models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    loaded = load_tokenizer(d)
    assert loaded.encode("hello world foo").ids == [1, 2, 0]
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nope")


def test_unreadable_tokenizer_is_a_clear_error(tmp_path):
    """A tokenizer.json that is there but unreadable is a ValueError naming it, not a bare
    Exception of tokenizers, nor (a directory) taken as no tokenizer."""
    tok = tmp_path / "tokenizer.json"
    tok.write_text('{"version": "1.0", "trunc')
    with pytest.raises(ValueError, match=r"cannot read '.*tokenizer\.json' \(not a valid tokenizer\.json\?\): "
                                         "EOF while parsing"):
        load_tokenizer(tmp_path)
    tok.unlink()
    tok.mkdir()
    with pytest.raises(ValueError, match=r"cannot read '.*tokenizer\.json': it is a directory"):
        load_tokenizer(tmp_path)
    tok.rmdir()
    tok.symlink_to(tmp_path / "gone.json")
    with pytest.raises(ValueError, match="broken link"):
        load_tokenizer(tmp_path)


def test_stop_ids_include_the_checkpoints_eos_token_ids(exported, tmp_path):
    """An --hf-target's own eos_token_id (generation_config.json, config.json) are stop ids
    too: Llama-3.1-Instruct's <|eom_id|> has no name among EOS_CANDIDATES."""
    import types
    from tokenizers import Tokenizer, models as tok_models
    from dsd_jax import loading
    d = _copy(exported, tmp_path / "ckpt")
    vocab = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|eom_id|>": 2, "<|eot_id|>": 3, "hi": 4}
    Tokenizer(tok_models.WordLevel(vocab, unk_token="hi")).save(str(d / "tokenizer.json"))
    gen = d / "generation_config.json"
    gen.write_text(json.dumps({"eos_token_id": [1, 2, 3]}))
    _set_config(d, eos_token_id=96)

    def stop_ids(**opts):
        target, _, tok, _ = loading.load_models(types.SimpleNamespace(hf_target=str(d), **opts))
        return loading.eos_token_ids(tok, str(d), target.config.vocab_size)

    assert stop_ids() == [1, 3, 2, 96]
    assert stop_ids(tokenizer=str(d / "tokenizer.json")) == [1, 3, 2, 96]  # --tokenizer FILE too
    assert loading.eos_token_ids(None, str(d), 97) == [1, 2, 3, 96]  # no tokenizer: the checkpoint's own
    with pytest.raises(ValueError, match="give vocab_size with hf_checkpoint"):
        loading.eos_token_ids(None, str(d))
    for text, match in [("{", r"generation_config\.json' is not valid JSON"),
                        ("[2]", r"generation_config\.json' must hold a JSON object"),
                        ('{"eos_token_id": 97}', r"generation_config\.json': eos_token_id must be a token id "
                                                 r"in \[0, 97\) or a list of them, got 97"),
                        ('{"eos_token_id": [2, true]}', r"got \[2, True\]"),
                        ('{"eos_token_id": "2"}', "got '2'")]:
        gen.write_text(text)
        with pytest.raises(loading.ArgumentError, match="--hf-target: cannot read the end-of-text ids .*"
                                                        + match):
            stop_ids()
    gen.unlink()
    _set_config(d, eos_token_id=None)
    assert stop_ids() == [1, 3]


def test_exported():
    assert models.load_hf is load_hf and models.load_tokenizer is load_tokenizer


def test_from_hf_config_variants():
    base = dict(model_type="llama", vocab_size=97, hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    # transformers 4 layout (top-level rope_theta + rope_scaling) == transformers 5 layout.
    old = models.ModelConfig.from_hf({**base, "rope_theta": 500000.0, "rope_scaling": scaling})
    new = models.ModelConfig.from_hf({**base, "rope_parameters": {**scaling, "rope_theta": 500000.0}})
    assert old == new and old.rope_theta == 500000.0 and old.head_dim == 16
    assert models.ModelConfig.from_hf({**base, "model_type": "qwen2"}).qkv_bias
    for bad, match in [({"attention_bias": True}, "attention_bias"), ({"hidden_act": "gelu"}, "gelu"),
                       ({"mlp_bias": True}, "mlp_bias"),
                       ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn")]:
        with pytest.raises(ValueError, match=match):
            models.ModelConfig.from_hf({**base, **bad})
    with pytest.raises(ValueError, match="missing required field 'num_attention_heads'"):
        models.ModelConfig.from_hf({k: v for k, v in base.items() if k != "num_attention_heads"})


# ---- export (save_hf) --------------------------------------------------------------------

def _sharp(model, seed: int = 0):
    """Our model with HF-parity-test weights: large matrices, random norms and biases."""
    rng = np.random.default_rng(seed)
    graph, state = nnx.split(model)
    for path, var in nnx.to_flat_state(state):
        x, name = var.get_value(), str(path[-1])
        if "norm" in name:
            v = rng.uniform(0.5, 1.5, x.shape)
        elif name.startswith("b"):
            v = rng.normal(0.0, 0.5, x.shape)
        else:
            v = rng.normal(0.0, 0.25, x.shape)
        var.set_value(jnp.asarray(v, x.dtype))
    return nnx.merge(graph, state)


def _assert_same_params(a, b):
    sa, sb = nnx.state(a), nnx.state(b)
    assert jax.tree.structure(sa) == jax.tree.structure(sb)
    for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


BUILTIN_LIKE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, model_type="llama", tie_word_embeddings=True)


@pytest.mark.parametrize("variant", ["builtin-like", "llama-scaled-untied", "llama3-factor-only",
                                     "llama3-no-original-max", "qwen2", "qwen3"])
def test_save_hf_round_trip(variant, tmp_path):
    """Ours -> save_hf -> transformers: same logits; -> load_hf: identical parameters.
    A llama3 scaling given without some of its keys (ModelConfig fills them in) is written
    whole: transformers refuses a block without low/high_freq_factor and takes
    max_position_embeddings for a missing original_max_position_embeddings."""
    extra = {"builtin-like": {},
             "llama-scaled-untied": dict(tie_word_embeddings=False, rope_theta=500000.0, rope_scaling=(
                 ("rope_type", "llama3"), ("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                 ("original_max_position_embeddings", 64))),
             "llama3-factor-only": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
             "llama3-no-original-max": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
             "qwen2": dict(model_type="qwen2", qkv_bias=True, rope_theta=1000.0),
             "qwen3": dict(model_type="qwen3", qk_norm=True, head_dim=24, tie_word_embeddings=False)}[variant]
    cfg = models.ModelConfig(**{**BUILTIN_LIKE, **extra})
    ours = _sharp(models.init_model(cfg, seed=0))
    out = models.save_hf(ours, tmp_path / "export")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in load_file(os.path.join(out, "model.safetensors"))

    back = load_hf(out)
    assert back.config.to_dict() == cfg.to_dict()
    _assert_same_params(ours, back)

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert hf_model.dtype == torch.float32 and hf_model.config.tie_word_embeddings == cfg.tie_word_embeddings
    assert hf_model.generation_config.eos_token_id is None  # generate stops at max_new_tokens only
    prompts = _prompts()
    ref = _hf_logits(hf_model, prompts)
    assert max(float(np.abs(r).max()) for r in ref) > 1.0
    diff = _max_diff(_full_forward(ours, prompts), ref)
    print(f"{variant}: exported, max |logit diff| vs transformers {diff:.2e}")
    assert diff < FP32_TOL, diff


def test_save_hf_of_loaded_checkpoint_and_bfloat16(checkpoints, tmp_path):
    """An HF checkpoint loaded and exported again loads identically; bf16 stays bf16."""
    path, _ = checkpoints["qwen2"]
    m = load_hf(path)
    _assert_same_params(m, load_hf(models.save_hf(m, tmp_path / "again")))
    m16 = load_hf(path, dtype="bfloat16")
    out = models.save_hf(m16, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    _assert_same_params(m16, load_hf(out, dtype="bfloat16"))


def test_save_hf_errors(tmp_path):
    model = models.init_model(models.ModelConfig(**BUILTIN_LIKE), seed=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="existing file"):
        models.save_hf(model, tmp_path / "file")
    with pytest.raises(ValueError, match="cannot create"):
        models.save_hf(model, tmp_path / "file" / "sub")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ValueError, match="sharded"):
        models.save_hf(model, sharded)
    odd = models.init_model(models.ModelConfig(**{**BUILTIN_LIKE, "qkv_bias": True}), seed=0)
    with pytest.raises(ValueError, match="qkv_bias"):
        models.save_hf(odd, tmp_path / "odd")
    assert not (tmp_path / "odd").exists()  # nothing written for a model that cannot be exported


# ---- damaged checkpoints: every problem is a ValueError naming the file and the tensor/field

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny llama checkpoint written by save_hf (no torch needed to build it)."""
    model = models.init_model(models.ModelConfig(**{**BUILTIN_LIKE, "tie_word_embeddings": False}), seed=0)
    return models.save_hf(model, tmp_path_factory.mktemp("exported") / "ckpt")


def _shard(d, tensors_by_file: dict, weight_map: object):
    """Rewrites `d` as a sharded checkpoint: the given shard files and index."""
    os.remove(d / "model.safetensors")
    for file, tensors in tensors_by_file.items():
        save_file(tensors, d / file)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _set_config(d, **fields):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(fields)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("case, match", [
    ("truncated", r"cannot read '.*model\.safetensors' \(corrupt or truncated safetensors file\?\)"),
    ("garbage", r"cannot read '.*model\.safetensors' \(corrupt or truncated safetensors file\?\)"),
    ("index_list", r"index\.json' is not a valid safetensors index.*weight_map"),
    ("index_not_object", r"index\.json' is not a valid safetensors index"),
    ("index_null_shard", r"index\.json': the shard file of tensor 'model\.norm\.weight' must be a file name, "
                         "got None"),
    ("index_wrong_shard", r"index\.json' lists tensor 'model\.norm\.weight' in 'a\.safetensors', which "
                          "does not hold it"),
    ("config_list", r"config\.json' must hold a JSON object, got a list"),
    ("config_not_utf8", r"config\.json' is not valid JSON"),
    ("vocab_null", "config.json: vocab_size must be an integer, got null"),
    ("heads_str", r"config.json: num_attention_heads must be an integer, got 'four' \(str\)"),
    ("eps_null", "config.json: rms_norm_eps must be a finite number, got null"),
    ("theta_str", r"config.json: rope_theta must be a finite number, got 'x' \(str\)"),
    ("rope_list", "config.json: rope_scaling must be null or an object"),
    ("rope_no_factor", "config.json rope_scaling: a llama3 RoPE scaling needs 'factor'"),
    ("int_tensor", r"tensor 'model\.embed_tokens\.weight' in '.*model\.safetensors' has dtype int32, "
                   "expected a floating dtype"),
    ("bool_tensor", r"tensor 'model\.norm\.weight' in '.*' has dtype bool, expected a floating dtype"),
])
def test_damaged_checkpoint_is_a_clear_error(exported, tmp_path, case, match):
    d = _copy(exported, tmp_path / "ckpt")
    weights = d / "model.safetensors"
    t = load_file(weights)
    if case == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[:len(data) // 2])
    elif case == "garbage":
        weights.write_bytes(b"\0" * 100)
    elif case == "index_list":
        _shard(d, {"a.safetensors": t}, list(t))
    elif case == "index_not_object":
        _shard(d, {"a.safetensors": t}, {})
        (d / "model.safetensors.index.json").write_text("[1, 2]")
    elif case == "index_null_shard":
        _shard(d, {"a.safetensors": t}, {**{k: "a.safetensors" for k in t}, "model.norm.weight": None})
    elif case == "index_wrong_shard":
        norm = {"model.norm.weight": t.pop("model.norm.weight")}
        _shard(d, {"a.safetensors": t, "b.safetensors": norm},
               {k: "a.safetensors" for k in [*t, "model.norm.weight"]})
    elif case == "config_list":
        (d / "config.json").write_text("[1, 2]")
    elif case == "config_not_utf8":
        (d / "config.json").write_bytes(b"\xff\xfe\0garbage")
    elif case == "vocab_null":
        _set_config(d, vocab_size=None)
    elif case == "heads_str":
        _set_config(d, num_attention_heads="four")
    elif case == "eps_null":
        _set_config(d, rms_norm_eps=None)
    elif case == "theta_str":
        _set_config(d, rope_theta="x")
    elif case == "rope_list":
        _set_config(d, rope_scaling=[1, 2], rope_parameters=None)
    elif case == "rope_no_factor":
        scaling = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
        _set_config(d, rope_scaling=scaling, rope_parameters={**scaling, "rope_theta": 10000.0})
    elif case == "int_tensor":
        _rewrite_weights(d, lambda t: t.__setitem__(
            "model.embed_tokens.weight", (t["model.embed_tokens.weight"] * 1000).astype(np.int32)))
    elif case == "bool_tensor":
        _rewrite_weights(d, lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"] > 0))
    with pytest.raises(ValueError, match=match):
        load_hf(d)


def test_legacy_rope_type_key_is_applied(exported, tmp_path):
    """`"type": "llama3"` (the legacy spelling) scales RoPE like `"rope_type"`."""
    from dsd_jax.models.transformer import rope_inv_freq
    d = _copy(exported, tmp_path / "ckpt")
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    _set_config(d, rope_scaling={"type": "llama3", **scaling}, rope_parameters=None)
    legacy = load_hf(d).config
    _set_config(d, rope_scaling={"rope_type": "llama3", **scaling})
    assert legacy == load_hf(d).config and legacy.rope_scaling_dict == {"rope_type": "llama3", **scaling}
    assert not np.array_equal(rope_inv_freq(legacy), rope_inv_freq(legacy.replace(rope_scaling=None)))


def test_llama3_without_original_max_matches_hf(checkpoints, tmp_path):
    """A transformers-4 style llama3 config without original_max_position_embeddings:
    transformers takes max_position_embeddings for it (dsd_jax used to take 8192)."""
    d = _copy(checkpoints["llama"][0], tmp_path / "ckpt")
    _set_config(d, rope_parameters=None, rope_theta=10000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    model = load_hf(d)
    prompts = _prompts()
    assert _max_diff(_full_forward(model, prompts), _hf_logits(hf_model, prompts)) < FP32_TOL
    assert model.config.rope_scaling_dict["original_max_position_embeddings"] == 128


def test_save_hf_refuses_an_existing_checkpoint(tmp_path):
    from tokenizers import Tokenizer, models as tok_models
    a = models.init_model(models.ModelConfig(**BUILTIN_LIKE), seed=0)
    b = models.init_model(models.ModelConfig(**{**BUILTIN_LIKE, "num_layers": 1}), seed=1)
    tok = Tokenizer(tok_models.WordLevel({"[UNK]": 0, "x": 1}, unk_token="[UNK]"))
    out = models.save_hf(a, tmp_path / "ckpt", tokenizer=tok)
    before = {f: (tmp_path / "ckpt" / f).read_bytes() for f in os.listdir(out)}
    with pytest.raises(ValueError, match=r"already holds a checkpoint \(config\.json, model\.safetensors, "
                                         r"tokenizer\.json\); pass overwrite=True"):
        models.save_hf(b, out)
    assert {f: (tmp_path / "ckpt" / f).read_bytes() for f in os.listdir(out)} == before  # untouched
    only_tok = tmp_path / "tok"
    only_tok.mkdir()
    tok.save(str(only_tok / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"already holds a checkpoint \(tokenizer\.json\)"):
        models.save_hf(b, only_tok)
    models.save_hf(b, out, overwrite=True)  # replaces the weights, keeps the tokenizer
    assert load_hf(out).config.num_layers == 1 and load_tokenizer(out) is not None
    models.save_hf(b, tmp_path / "empty_dir_is_fine")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    models.save_hf(b, tmp_path / "other")  # unrelated files are not a checkpoint


def test_save_hf_over_a_checkpoint_drops_its_generation_config(tmp_path):
    """The replaced model's generation_config.json (its stop ids) must not apply to the new one."""
    from models.hf import checkpoint_eos_ids
    a = models.init_model(models.ModelConfig(**BUILTIN_LIKE), seed=0)
    out = models.save_hf(a, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    with pytest.raises(ValueError, match=r"already holds a checkpoint .*generation_config\.json"):
        models.save_hf(a, out)
    models.save_hf(a, out, overwrite=True)
    assert not os.path.exists(tmp_path / "ckpt" / "generation_config.json")
    assert list(checkpoint_eos_ids(out, VOCAB)) == []
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]  # written whole, nothing left behind


def test_sharded_checkpoint_with_an_unlisted_tensor_is_an_error(checkpoints, tmp_path):
    """A shard holding a tensor its index does not list (an extra bias, a second lm_head) is
    refused as the single-file checkpoint's extra tensor is, not skipped."""
    path, hf_model = checkpoints["llama"]
    hf_model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.layers.0.self_attn.o_proj.weight"]
    tensors = load_file(tmp_path / shard)
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
    save_file(tensors, tmp_path / shard, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"holds tensor\(s\) \['model\.layers\.0\.self_attn\.o_proj\.bias'\] "
                                         r"that .* does not list"):
        load_hf(tmp_path)


def test_fp8_weights_are_named_not_called_corrupt(checkpoints, tmp_path):
    from safetensors.torch import load_file as torch_load, save_file as torch_save
    d = _copy(checkpoints["llama"][0], tmp_path / "ckpt")
    tensors = torch_load(d / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    torch_save(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"'{name}' .* stored as F8_E4M3.*a quantised checkpoint\?"):
        load_hf(d)


def test_qwen3_head_dim_defaults_as_transformers():
    """transformers' Qwen3Config defaults head_dim to 128, not hidden_size / heads."""
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    assert models.ModelConfig.from_hf({**base, "model_type": "qwen3"}).head_dim == 128
    assert transformers.Qwen3Config(**base).head_dim == 128
    assert models.ModelConfig.from_hf({**base, "model_type": "llama"}).head_dim == 16


def test_numpy_float_settings_save_as_json(tmp_path):
    """A config built from numpy values saves (it raised after writing part of a checkpoint)."""
    cfg = models.ModelConfig(**{**BUILTIN_LIKE, "rms_norm_eps": np.float32(1e-5), "rope_theta": np.float64(1e4)})
    eps = float(np.float32(1e-5))
    assert type(cfg.rms_norm_eps) is float and json.loads(json.dumps(cfg.to_dict()))["rms_norm_eps"] == eps
    out = models.save_hf(models.init_model(cfg, seed=0), tmp_path / "ckpt")
    assert load_hf(out).config.rms_norm_eps == cfg.rms_norm_eps
