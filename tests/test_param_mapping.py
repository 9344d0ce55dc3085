"""param_mapping's plan: a trainer leaf feeding one of our parameters must be floating point."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dsd_jax import models, param_mapping as pm
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
