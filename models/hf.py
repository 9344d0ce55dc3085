"""Loading Hugging Face checkpoints (Llama 3.x, Qwen2/2.5, Qwen3) from a local directory,
and exporting our models to one.

`load_hf(path)` reads `config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json`) and returns a `Transformer`. Nothing is downloaded:
`path` must be an existing local directory.

The model is first built abstractly with `nnx.eval_shape` (no parameter memory), then
every parameter is read from the checkpoint, checked against the expected shape,
transposed where needed (HF linear weights are `[out, in]`, ours `[in, out]`), cast to
the requested dtype and placed on the device once. Any tensor the model would not use
is an error, not a silent skip: it means a feature we do not implement (e.g. o_proj
or MLP biases), which would otherwise give wrong numbers.

`save_hf(model, directory)` is the reverse: `config.json` + `model.safetensors` that
`transformers.AutoModelForCausalLM.from_pretrained` and `load_hf` both load (used to
run the same weights in transformers, e.g. for `benchmarks/side_by_side.py`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .config import ModelConfig, _is_int
from .layout import (CONFIG_FILE, GENERATION_CONFIG_FILE, KIND_NAMES, TOKENIZER_FILE, WEIGHTS_FILE,
                     WEIGHTS_INDEX_FILE, atomic_write, checkpoint_kind)
from .transformer import Transformer

# Files whose presence means a directory already holds a checkpoint (save_hf, save_eagle3).
# a generation_config.json is the checkpoint's too: its stop ids would apply to a model saved over it
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, TOKENIZER_FILE, GENERATION_CONFIG_FILE)
# Parameter dtypes a checkpoint may store; anything else (int8 codes, bool) cast to float
# would load as garbage weights.
FLOAT_DTYPES = tuple(np.dtype(t) for t in (jnp.bfloat16, np.float16, np.float32, np.float64))
_READABLE_DTYPES = {"BF16", "F16", "F32", "F64"}  # the same, as safetensors headers name them

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
    cfg = _read_json(cfg_path)
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path!r} must hold a JSON object, got a {type(cfg).__name__}")
    return cfg


def _read_json(file: str):
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file!r} is not valid JSON: {e}") from None


def _open_safetensors(file: str):
    from safetensors import safe_open

    try:
        return safe_open(file, framework="np")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError
        raise ValueError(f"cannot read {file!r} (corrupt or truncated safetensors file?): {e}") from e


def _read_index(index: str) -> dict[str, str]:
    """The `weight_map` (tensor name -> shard file name) of a sharded checkpoint's index."""
    doc = _read_json(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index!r} is not a valid safetensors index: it needs a \"weight_map\" "
                         "object mapping tensor names to shard files")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise ValueError(f"{index!r}: the shard file of tensor {name!r} must be a file name, "
                             f"got {shard!r}")
    return weight_map


def _weight_files(path: str) -> dict[str, str]:
    """Maps every tensor name to the safetensors file that holds it."""
    single = os.path.join(path, WEIGHTS_FILE)
    index = os.path.join(path, WEIGHTS_INDEX_FILE)
    if os.path.isfile(single):
        with _open_safetensors(single) as f:
            return {name: single for name in f.keys()}
    if os.path.isfile(index):
        files, shards = {}, {}
        for name, shard in _read_index(index).items():
            shard_path = os.path.join(path, shard)
            if os.path.dirname(os.path.normpath(shard)) or not shard.endswith(".safetensors"):
                raise ValueError(f"{index!r} names an unexpected shard file {shard!r} for {name!r}")
            if not os.path.isfile(shard_path):
                raise FileNotFoundError(f"shard {shard_path!r} listed in {index!r} (for {name!r}) not found")
            if shard_path not in shards:  # headers only: cheap, and a bad shard is named up front
                with _open_safetensors(shard_path) as f:
                    shards[shard_path] = set(f.keys())
            if name not in shards[shard_path]:
                raise ValueError(f"{index!r} lists tensor {name!r} in {shard!r}, which does not hold it")
            files[name] = shard_path
        for shard_path, names in shards.items():  # a tensor the index leaves out is not skipped silently
            unlisted = sorted(n for n in names if files.get(n) != shard_path)
            if unlisted:
                raise ValueError(f"shard {shard_path!r} holds tensor(s) {unlisted[:3]} that {index!r} does not "
                                 "list for it (an extra or duplicate weight): fix the index or the shard")
        return files
    found = sorted(os.listdir(path))
    hint = " (only safetensors checkpoints are supported)" if any(
        f.endswith((".bin", ".pt", ".pth")) for f in found) else ""
    raise FileNotFoundError(f"no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE} in {path!r}{hint}; found: {found}")


def _check_stored_dtype(f, name: str, file: str) -> None:
    """A tensor stored in a float format numpy cannot read (FP8, FP4) is named as such before
    reading it: numpy's own error reads like a corrupt file."""
    dtype = f.get_slice(name).get_dtype()  # from the header: "BF16", "F8_E4M3", ...
    if dtype.startswith("F") and dtype not in _READABLE_DTYPES:  # (ints, bools: `read_tensor`)
        raise ValueError(f"tensor {name!r} in {file!r} is stored as {dtype}, not a float dtype this loader "
                         f"reads ({', '.join(sorted(_READABLE_DTYPES))}): a quantised checkpoint?")


class _TensorReader:
    """Reads tensors by name across shards, keeping each shard open once."""

    def __init__(self, files: dict[str, str]):
        self.files = files
        self._open: dict[str, Any] = {}

    def get(self, name: str) -> np.ndarray:
        file = self.files[name]
        if file not in self._open:
            self._open[file] = _open_safetensors(file)
        _check_stored_dtype(self._open[file], name, file)
        try:
            return self._open[file].get_tensor(name)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError
            raise ValueError(f"cannot read tensor {name!r} from {file!r} (corrupt safetensors file?): "
                             f"{e}") from e

    def close(self):
        self._open.clear()


def _hf_name(path: tuple) -> tuple[str, bool]:
    if path[0] == "layers":
        _, i, leaf = path
        name, transpose = _LAYER_MAP[leaf]
        return f"model.layers.{i}.{name}", transpose
    return _TOP_MAP[path[0]]


def read_tensor(reader, files, path, name: str, shape: tuple, transpose: bool, dtype, what: str):
    """Tensor `name` of a safetensors checkpoint as a device array of our `shape` (stored
    transposed in the HF layout when `transpose`), with clear errors for a missing tensor,
    a wrong shape or a non-floating dtype; `what` ends the missing-tensor message (e.g. "for llama")."""
    hf_shape = shape[::-1] if transpose else shape
    if name not in files:
        raise ValueError(f"checkpoint {path!r} is missing tensor {name!r} (expected shape "
                         f"{hf_shape}) {what}")
    arr = reader.get(name)
    if tuple(arr.shape) != hf_shape:
        raise ValueError(f"tensor {name!r} has shape {tuple(arr.shape)}, expected {hf_shape} "
                         f"from config.json")
    if arr.dtype not in FLOAT_DTYPES:  # casting e.g. quantised int codes would give garbage weights
        raise ValueError(f"tensor {name!r} in {files[name]!r} has dtype {arr.dtype}, expected a floating "
                         f"dtype ({', '.join(str(t) for t in FLOAT_DTYPES)}): a quantised checkpoint?")
    arr = arr.T if transpose else arr
    return jax.device_put(np.ascontiguousarray(arr.astype(dtype, copy=False)))


def _check_tied_head(reader, path: str) -> None:
    """Some tied checkpoints also store the head; a copy of the embedding is fine. One that
    differs is what transformers 5 uses (it then leaves the two untied): an error here, as
    our tied model has no head of its own and would silently give other logits."""
    head, embed = reader.get("lm_head.weight"), reader.get("model.embed_tokens.weight")
    if head.shape != embed.shape or not np.array_equal(head, embed):
        raise ValueError(f"checkpoint {path!r}: config.json has tie_word_embeddings=true but its "
                         "'lm_head.weight' differs from 'model.embed_tokens.weight' (transformers would "
                         "use the stored lm_head.weight): set tie_word_embeddings to false to load both, "
                         "or remove lm_head.weight to tie the head to the embedding")


def checkpoint_dtype(hf_cfg: dict) -> str:
    """The dtype a checkpoint loads in under dtype "auto": "bfloat16" where its config.json says
    so (`torch_dtype`, or transformers 5's `dtype`), else "float32" (a float16 checkpoint
    widens exactly; bfloat16 would drop 3 of its mantissa bits)."""
    return "bfloat16" if (hf_cfg.get("torch_dtype") or hf_cfg.get("dtype")) == "bfloat16" else "float32"


def load_hf(path, dtype: str = "auto") -> Transformer:
    """Loads a local Llama / Qwen2 / Qwen3 safetensors checkpoint directory as a `Transformer`.

    dtype: "auto" (default, as transformers 5 and vLLM): the checkpoint's own
    (`checkpoint_dtype`: a bf16 8B stays 16 GB, not 32); or "float32" / "bfloat16", the
    parameter and activation dtype the checkpoint's weights are cast to.
    """
    hf_cfg = read_hf_config(path)
    path = os.fspath(path)
    if dtype == "auto":
        dtype = checkpoint_dtype(hf_cfg)
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
            values[param_path] = read_tensor(reader, files, path, name, tuple(var.get_value().shape),
                                             transpose, target_dtype, f"for {cfg.model_type}")
            used.add(name)
        if cfg.tie_word_embeddings and "lm_head.weight" in files:
            _check_tied_head(reader, path)
            used.add("lm_head.weight")
    finally:
        reader.close()

    ignorable = {n for n in files if n.endswith("rotary_emb.inv_freq")}
    unexpected = sorted(set(files) - used - ignorable)
    if unexpected:
        shown = ", ".join(repr(n) for n in unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        raise ValueError(f"checkpoint {path!r} has {len(unexpected)} tensor(s) this {cfg.model_type} "
                         f"model does not use (an unsupported feature?): {shown}")

    for param_path, var in nnx.to_flat_state(state):
        var.set_value(values[param_path])
    return nnx.merge(graphdef, state)


def load_tokenizer(path):
    """The `tokenizers.Tokenizer` of a checkpoint directory, or None without `tokenizer.json`.
    One that is there but cannot be read is a ValueError naming it (never taken as none)."""
    path = _check_dir(path)
    tok_path = os.path.join(path, TOKENIZER_FILE)
    if not os.path.lexists(tok_path):
        return None
    if not os.path.isfile(tok_path):
        what = "a directory" if os.path.isdir(tok_path) else "not a readable file (a broken link?)"
        raise ValueError(f"cannot read {tok_path!r}: it is {what}")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(tok_path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise ValueError(f"cannot read {tok_path!r} (not a valid tokenizer.json?): {e}") from e


def checkpoint_eos_ids(path, vocab_size: int) -> list[int]:
    """The `eos_token_id`s (an int or a list) of a checkpoint directory's
    generation_config.json (what transformers' `generate` stops at) and config.json, in that
    order without repeats; [] when neither names one. A file that is not a JSON object, or
    an id that is not an integer in [0, vocab_size), is a ValueError naming the file."""
    path = _check_dir(path)
    out: list[int] = []
    for name in (GENERATION_CONFIG_FILE, CONFIG_FILE):
        file = os.path.join(path, name)
        if not os.path.exists(file):
            continue
        doc = _read_json(file)
        if not isinstance(doc, dict):
            raise ValueError(f"{file!r} must hold a JSON object, got a {type(doc).__name__}")
        ids = doc.get("eos_token_id")
        for tid in [] if ids is None else ids if isinstance(ids, list) else [ids]:
            if not (_is_int(tid) and 0 <= tid < vocab_size):
                raise ValueError(f"{file!r}: eos_token_id must be a token id in [0, {vocab_size}) or a list "
                                 f"of them, got {ids!r}")
            if tid not in out:
                out.append(int(tid))
    return out


# ---- export --------------------------------------------------------------------------------

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_config(cfg: ModelConfig) -> dict:
    """The Hugging Face `config.json` dict of a `ModelConfig` (the inverse of `ModelConfig.from_hf`).

    RoPE settings are written in both layouts, transformers 4 (top-level `rope_theta`,
    `rope_scaling`) and 5 (`rope_parameters`), so either version reads them; a llama3
    scaling with all four of its keys as the model uses them (transformers requires
    them, and would otherwise take `max_position_embeddings` for the original one). No special
    token ids are written (`bos`/`eos` null: our models have none), so transformers'
    `generate` stops at `max_new_tokens` only, as an engine request without stop ids.
    """
    # A feature HF ties to the architecture must match it, or HF would build another model
    # (llama with attention_bias also has an o_proj bias, which we do not have).
    if cfg.qkv_bias != (cfg.model_type == "qwen2") or cfg.qk_norm != (cfg.model_type == "qwen3"):
        raise ValueError(f"cannot export a {cfg.model_type} model with qkv_bias={cfg.qkv_bias}, "
                         f"qk_norm={cfg.qk_norm}: Hugging Face has qkv biases only for qwen2 and q/k "
                         "norms only for qwen3")
    scaling = cfg.rope_scaling_dict  # every llama3 key, resolved by ModelConfig
    rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if scaling:
        rope_parameters = {**scaling, "rope_theta": cfg.rope_theta}
    out = {
        "architectures": [_ARCHITECTURES[cfg.model_type]],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling,
        "rope_parameters": rope_parameters,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False,  # o_proj bias; qwen2's q/k/v biases are implied by its model_type
        "mlp_bias": False,
        "use_sliding_window": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "torch_dtype": cfg.dtype,  # transformers 4
        "dtype": cfg.dtype,  # transformers 5
    }
    return out


def check_out_dir(directory, overwrite: bool, who: str = "save_hf", own: str = "hf") -> str:
    """`directory`, created if needed, for writing a checkpoint of the kind `own` ("hf" or
    "eagle3", see `layout.checkpoint_kind`): refuses a file, and a directory already holding a
    checkpoint unless `overwrite` (as `models.save`). A checkpoint of any other kind there (a
    `models.save` one, a target's for an EAGLE-3 head, a head for a target, files of no known
    format) is refused even with `overwrite`: our config.json and model.safetensors would
    replace its own and it would no longer load."""
    directory = os.fspath(directory)
    found = checkpoint_kind(directory)
    if found.kind == "file":
        raise ValueError(f"{who}: {directory!r} is an existing file, not a directory")
    if found.kind not in ("empty", "other", own):
        raise ValueError(f"{who}: {directory!r} holds {found.what}, not {KIND_NAMES[own]}; writing "
                         f"{CONFIG_FILE} and {WEIGHTS_FILE} there would make it unloadable: use another "
                         "directory")
    if os.path.isfile(os.path.join(directory, WEIGHTS_INDEX_FILE)):
        # even with overwrite: its shards would stay behind beside the new weights
        raise ValueError(f"{who}: {directory!r} holds a sharded checkpoint ({WEIGHTS_INDEX_FILE}); "
                         "loaders would not know which weights to read: use an empty directory")
    present = [f for f in CHECKPOINT_FILES if os.path.exists(os.path.join(directory, f))]
    if present and not overwrite:
        raise ValueError(f"{who}: {directory!r} already holds a checkpoint ({', '.join(present)}); "
                         "pass overwrite=True to replace it")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{who}: cannot create the directory {directory!r}: {e}") from None
    return directory


def save_hf(model: Transformer, directory, tokenizer=None, *, overwrite: bool = False) -> str:
    """Writes `model` as a Hugging Face checkpoint directory; returns its path.

    Files: `config.json` (see `hf_config`) and `model.safetensors` (HF names, `[out, in]`
    linear weights, the model's own dtype), plus `tokenizer.json` when a
    `tokenizers.Tokenizer` is given. `directory` is created if needed; an existing file
    there is an error. A tied model stores no `lm_head.weight` (HF ties it on load).
    Loading it back with `load_hf` gives identical parameters.

    overwrite: replace the checkpoint already in `directory` (otherwise a directory holding
    config.json, model.safetensors, tokenizer.json or generation_config.json is an error); a
    tokenizer.json there is kept unless `tokenizer` is given, a generation_config.json removed
    (its stop ids were the replaced model's). A sharded checkpoint, or one of another kind (of
    `models.save`, an EAGLE-3 head: see `check_out_dir`), is never overwritten.
    """
    from safetensors.numpy import save_file

    cfg = model.config
    config = hf_config(cfg)
    directory = check_out_dir(directory, overwrite)
    tensors = {}
    for param_path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, transpose = _hf_name(param_path)
        arr = np.asarray(jax.device_get(var.get_value()))
        tensors[name] = np.ascontiguousarray(arr.T if transpose else arr)
    text = json.dumps(config, indent=2) + "\n"  # before any write: a config that is not JSON fails here
    # each file whole or not at all (a failed save leaves the replaced checkpoint's), config.json last
    # (save_file writes the temporary file by its name: no second copy of the weights in memory)
    atomic_write(os.path.join(directory, WEIGHTS_FILE),
                 lambda f: save_file(tensors, f.name, metadata={"format": "pt"}), mode="wb")
    stale = os.path.join(directory, GENERATION_CONFIG_FILE)
    if os.path.exists(stale):  # the replaced checkpoint's (overwrite): we write none
        os.remove(stale)
    atomic_write(os.path.join(directory, CONFIG_FILE), lambda f: f.write(text))
    if tokenizer is not None:
        tokenizer.save(os.path.join(directory, TOKENIZER_FILE))
    return directory


__all__ = ["load_hf", "load_tokenizer", "read_hf_config", "save_hf", "hf_config", "checkpoint_eos_ids"]
