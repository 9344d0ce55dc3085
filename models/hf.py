"""Loading Hugging Face checkpoints (Llama 3.x, Qwen2/2.5, Qwen3) from a local directory.

`load_hf(path)` reads `config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json`) and returns a `Transformer`. Nothing is downloaded:
`path` must be an existing local directory.

The model is first built abstractly with `nnx.eval_shape` (no parameter memory), then
every parameter is read from the checkpoint, checked against the expected shape,
transposed where needed (HF linear weights are `[out, in]`, ours `[in, out]`), cast to
the requested dtype and placed on the device once. Any tensor the model would not use
is an error, not a silent skip: it means a feature we do not implement (e.g. o_proj
or MLP biases), which would otherwise give wrong numbers.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
from flax import nnx

from .config import ModelConfig
from .transformer import Transformer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"

# Our per-layer parameter -> (HF name under `model.layers.N.`, transpose?).
_LAYER_MAP = {
    "attn_norm": ("input_layernorm.weight", False),
    "wq": ("self_attn.q_proj.weight", True),
    "wk": ("self_attn.k_proj.weight", True),
    "wv": ("self_attn.v_proj.weight", True),
    "wo": ("self_attn.o_proj.weight", True),
    "bq": ("self_attn.q_proj.bias", False),
    "bk": ("self_attn.k_proj.bias", False),
    "bv": ("self_attn.v_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "w_gate": ("mlp.gate_proj.weight", True),
    "w_up": ("mlp.up_proj.weight", True),
    "w_down": ("mlp.down_proj.weight", True),
}
_TOP_MAP = {
    "embed": ("model.embed_tokens.weight", False),
    "final_norm": ("model.norm.weight", False),
    "lm_head": ("lm_head.weight", True),
}


def _check_dir(path) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint directory {path!r} does not exist "
                                "(load_hf reads local files only; nothing is downloaded)")
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint path {path!r} is not a directory")
    return path


def read_hf_config(path) -> dict:
    """The raw `config.json` dict of a local checkpoint directory."""
    path = _check_dir(path)
    cfg_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{cfg_path!r} not found: a Hugging Face checkpoint needs {CONFIG_FILE}")
    try:
        with open(cfg_path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path!r} is not valid JSON: {e}") from None


def _weight_files(path: str) -> dict[str, str]:
    """Maps every tensor name to the safetensors file that holds it."""
    from safetensors import safe_open

    single = os.path.join(path, WEIGHTS_FILE)
    index = os.path.join(path, WEIGHTS_INDEX_FILE)
    if os.path.isfile(single):
        with safe_open(single, framework="np") as f:
            return {name: single for name in f.keys()}
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index!r} is not a valid safetensors index ({e!r})") from None
        files = {}
        for name, shard in weight_map.items():
            shard_path = os.path.join(path, shard)
            if os.path.dirname(os.path.normpath(shard)) or not shard.endswith(".safetensors"):
                raise ValueError(f"{index!r} names an unexpected shard file {shard!r} for {name!r}")
            if not os.path.isfile(shard_path):
                raise FileNotFoundError(f"shard {shard_path!r} listed in {index!r} (for {name!r}) not found")
            files[name] = shard_path
        return files
    found = sorted(os.listdir(path))
    hint = " (only safetensors checkpoints are supported)" if any(
        f.endswith((".bin", ".pt", ".pth")) for f in found) else ""
    raise FileNotFoundError(f"no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE} in {path!r}{hint}; found: {found}")


class _TensorReader:
    """Reads tensors by name across shards, keeping each shard open once."""

    def __init__(self, files: dict[str, str]):
        self.files = files
        self._open: dict[str, Any] = {}

    def get(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        file = self.files[name]
        if file not in self._open:
            self._open[file] = safe_open(file, framework="np")
        return self._open[file].get_tensor(name)

    def close(self):
        self._open.clear()


def _hf_name(path: tuple) -> tuple[str, bool]:
    if path[0] == "layers":
        _, i, leaf = path
        name, transpose = _LAYER_MAP[leaf]
        return f"model.layers.{i}.{name}", transpose
    return _TOP_MAP[path[0]]


def load_hf(path, dtype: str = "float32") -> Transformer:
    """Loads a local Llama / Qwen2 / Qwen3 safetensors checkpoint directory as a `Transformer`.

    dtype: "float32" or "bfloat16", the parameter and activation dtype (the checkpoint's
    own dtype, e.g. bf16, is cast to it).
    """
    hf_cfg = read_hf_config(path)
    path = os.fspath(path)
    cfg = ModelConfig.from_hf(hf_cfg, dtype=dtype)
    files = _weight_files(path)

    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    target_dtype = np.dtype(cfg.jnp_dtype)
    reader = _TensorReader(files)
    used = set()
    values = {}
    try:
        for param_path, var in nnx.to_flat_state(state):
            name, transpose = _hf_name(param_path)
            shape = tuple(var.get_value().shape)
            hf_shape = shape[::-1] if transpose else shape
            if name not in files:
                raise ValueError(f"checkpoint {path!r} is missing tensor {name!r} "
                                 f"(expected shape {hf_shape}) for {cfg.model_type}")
            arr = reader.get(name)
            if tuple(arr.shape) != hf_shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(arr.shape)}, expected {hf_shape} "
                                 f"from config.json")
            if transpose:
                arr = arr.T
            arr = np.ascontiguousarray(arr.astype(target_dtype, copy=False))
            values[param_path] = jax.device_put(arr)
            used.add(name)
    finally:
        reader.close()

    ignorable = {n for n in files if n.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        ignorable.add("lm_head.weight")  # some tied checkpoints store the copy too; HF ignores it
    unexpected = sorted(set(files) - used - ignorable)
    if unexpected:
        shown = ", ".join(repr(n) for n in unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        raise ValueError(f"checkpoint {path!r} has {len(unexpected)} tensor(s) this {cfg.model_type} "
                         f"model does not use (an unsupported feature?): {shown}")

    for param_path, var in nnx.to_flat_state(state):
        var.set_value(values[param_path])
    return nnx.merge(graphdef, state)


def load_tokenizer(path):
    """The `tokenizers.Tokenizer` of a checkpoint directory, or None without `tokenizer.json`."""
    path = _check_dir(path)
    tok_path = os.path.join(path, TOKENIZER_FILE)
    if not os.path.isfile(tok_path):
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tok_path)


__all__ = ["load_hf", "load_tokenizer", "read_hf_config"]
