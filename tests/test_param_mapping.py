"""param_mapping's plan: a trainer leaf feeding one of our parameters must be floating point;
LoRA adapters merge through its rules."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dsd_jax import lora, models, param_mapping as pm
from conftest import tiny_config


@pytest.fixture(scope="module")
def ours():
    """(our param state, {dotted name: leaf}, a mapping that reads each leaf under its own name)."""
    like = nnx.state(models.init_model(tiny_config(), seed=0), nnx.Param)
    named, _ = pm.flatten(like)
    layer = [n.replace("layers.0.", "layers.{i}.") for n in named if n.startswith("layers.0.")]
    rules = [pm.Rule(n, n) for n in named if not n.startswith("layers.")] + [pm.Rule(n, n) for n in layer]
    return like, named, pm.ParamMapping("identity", rules, ignore=(r"step",))


@pytest.mark.parametrize("leaf, dtype", [("embed", jnp.int32), ("final_norm", jnp.bool_),
                                         ("layers.1.wq", jnp.int8)])
def test_non_float_leaf_is_named(ours, leaf, dtype):
    like, named, mapping = ours
    theirs = {**named, leaf: jnp.asarray(named[leaf] * 1e4).astype(dtype)}  # e.g. quantised codes
    with pytest.raises(ValueError, match=rf"trainer leaf '{leaf}' \(for our '{leaf}'\) has dtype "
                                         rf"{np.dtype(dtype).name}, expected a floating dtype"):
        pm.map_params(mapping, theirs, like)


def test_float_leaves_cast_and_ignored_leaves_any_dtype(ours):
    like, named, mapping = ours
    theirs = {**named, "embed": named["embed"].astype(jnp.bfloat16),
              "step": jnp.asarray(7, jnp.int32)}  # ignored: never cast, so any dtype is fine
    out, _ = pm.flatten(pm.map_params(mapping, theirs, like))
    assert out["embed"].dtype == jnp.float32
    np.testing.assert_array_equal(out["embed"], named["embed"].astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(out["layers.0.wq"], named["layers.0.wq"])


def test_lora_adapters_merge_through_the_rules_and_refuse_what_they_cannot_lay_out(ours):
    """An adapter on a leaf read as is merges into it as base + (alpha/rank) a.b (this
    mapping's identity rules); one on a weight a rule transposes, or with integer codes, is
    refused by name."""
    like, named, mapping = ours
    a, b = jnp.full((32, 2), 0.5), jnp.full((2, 32), 0.25)  # wq: [32, 32]
    adapters = {"layers.1.wq_lora_a": a, "layers.1.wq_lora_b": b}
    merged, _ = pm.flatten(lora.LoraWeights(mapping, 4.0, adapters, like).merged(adapters, like))
    np.testing.assert_allclose(merged["layers.1.wq"], named["layers.1.wq"] + 4.0 / 2 * (a @ b), rtol=1e-6)
    np.testing.assert_array_equal(merged["layers.0.wq"], named["layers.0.wq"])
    transposed = pm.ParamMapping("t", [pm.Rule("layers.{i}.wq", "layers.{i}.wq", "transpose")] +
                                 [r for r in mapping.rules if r.ours != "layers.{i}.wq"])
    with pytest.raises(ValueError, match=r"adapter on 'layers\.1\.wq': its rule transposes the weight"):
        lora.LoraWeights(transposed, 4.0, adapters, like)
    with pytest.raises(ValueError, match=r"'layers\.1\.wq_lora_b' has dtype int8, expected a float"):
        lora.LoraWeights(mapping, 4.0, {**adapters, "layers.1.wq_lora_b": b.astype(jnp.int8)}, like)
