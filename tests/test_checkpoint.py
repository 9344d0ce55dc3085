"""models.save / models.restore: bit-identical round trips and clear errors."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from dsd_jax.models import ModelConfig, init_model
from dsd_jax.models.checkpoint import restore, save

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, tie_word_embeddings=True)


def _params(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _assert_identical(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cfg", [CFG, CFG.replace(tie_word_embeddings=False, model_type="qwen3",
                                                  qk_norm=True),
                                 CFG.replace(model_type="qwen2", qkv_bias=True)])
def test_round_trip_bit_identical(tmp_path, dtype, cfg):
    model = init_model(cfg.replace(dtype=dtype), seed=3)
    save(model, tmp_path / "ckpt")
    back = restore(tmp_path / "ckpt")
    assert back.config == model.config
    _assert_identical(_params(model), _params(back))


def test_save_cast_and_restore_cast(tmp_path):
    model = init_model(CFG, seed=1)
    save(model, tmp_path / "c", dtype="bfloat16")
    assert json.loads((tmp_path / "c" / "config.json").read_text())["dtype"] == "bfloat16"
    back = restore(tmp_path / "c")
    assert back.config.dtype == "bfloat16" and back.embed[...].dtype == np.dtype("bfloat16")
    up = restore(tmp_path / "c", dtype="float32")
    assert up.config.dtype == "float32" and up.embed[...].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(up.embed[...]),
                                  np.asarray(model.embed[...].astype("bfloat16").astype("float32")))


def test_refuses_to_overwrite(tmp_path):
    model = init_model(CFG)
    save(model, tmp_path / "c")
    with pytest.raises(FileExistsError, match="not empty"):
        save(model, tmp_path / "c")
    save(model, tmp_path / "c", overwrite=True)
    restore(tmp_path / "c")


def test_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        restore(tmp_path / "nope")


def test_missing_config(tmp_path):
    save(init_model(CFG), tmp_path / "c")
    (tmp_path / "c" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        restore(tmp_path / "c")


def test_corrupt_config(tmp_path):
    save(init_model(CFG), tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt checkpoint config"):
        restore(tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text(json.dumps({"vocab_size": 64, "bogus": 1}))
    with pytest.raises(ValueError, match="invalid checkpoint config"):
        restore(tmp_path / "c")


def test_missing_params(tmp_path):
    save(init_model(CFG), tmp_path / "c")
    import shutil
    shutil.rmtree(tmp_path / "c" / "params")
    with pytest.raises(FileNotFoundError, match="params/ is missing"):
        restore(tmp_path / "c")


def _swap_config(tmp_path, **changes):
    save(init_model(CFG), tmp_path / "c")
    cfg_file = tmp_path / "c" / "config.json"
    d = json.loads(cfg_file.read_text())
    d.update(changes)
    cfg_file.write_text(json.dumps(d))
    return tmp_path / "c"


def test_shape_mismatch_named(tmp_path):
    path = _swap_config(tmp_path, intermediate_size=64)
    with pytest.raises(ValueError, match=r"does not match its config.*layers/0/w_(gate|up|down).*has shape"):
        restore(path)


def test_tree_mismatch_named(tmp_path):
    path = _swap_config(tmp_path, num_layers=3)
    with pytest.raises(ValueError, match=r"does not match its config.*missing.*layers/2"):
        restore(path)
    path2 = _swap_config(tmp_path / "x", tie_word_embeddings=False)
    with pytest.raises(ValueError, match=r"missing.*lm_head"):
        restore(path2)


def test_dtype_mismatch_named(tmp_path):
    path = _swap_config(tmp_path, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"dtype float32, config says bfloat16"):
        restore(path)


def test_save_rejects_non_model(tmp_path):
    with pytest.raises(TypeError):
        save({"a": 1}, tmp_path / "c")
