"""Saving and restoring models with Orbax.

A checkpoint is a directory::

    path/config.json   the ModelConfig (`ModelConfig.to_dict`), so restore needs only the path
    path/params/       an Orbax checkpoint of the NNX parameter state (a pure nested dict)
    path/checksums.json  SHA-256 of each parameter's bytes as saved, and of config.json's bytes

`restore` checks the saved parameter tree against the one the config implies (names,
shapes, dtypes) before reading any weights, and names the first mismatch. After reading
them it checks each parameter, and config.json, against its checksum: Orbax reads a flipped
bit in its data files back as a different weight without complaint, and a flipped bit in the
config (an rms_norm_eps of 1e-04 for 1e-05) parses as another valid model. A checkpoint
written before checksums were recorded (no checksums.json, or none for config.json) restores
without those checks.

`save` has Orbax write the parameters into a staging folder whose full path has no glob
characters (Orbax globs the whole path when it merges its OCDBT files, and under a path with
`[` it silently wrote no data), checks them complete, and only then renames them into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax.sharding import default_device
from .config import ModelConfig
from .layout import CHECKSUMS_FILE, CONFIG_FILE, PARAMS_DIR, STAGING_PREFIX, checkpoint_kind
from .transformer import Transformer, init_model

CHECKSUM_ALGORITHM = "sha256"
# What Orbax's metadata read needs in params/: without one of these it returns no tree.
_ORBAX_ENTRIES = ("_METADATA", "manifest.ocdbt", "d/")
# Read as a pattern by the glob Orbax runs over the full path of the folder it saves into.
_GLOB_CHARS = "[]*?"


def _pure_params(model: Transformer) -> dict:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _flatten(tree, prefix=()) -> dict:
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flatten(v, prefix + (str(k),)))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(_flatten(v, prefix + (str(i),)))
    else:
        out["/".join(prefix)] = tree
    return out


def _metadata_problem(params_dir: Path) -> str:
    """Why Orbax found no parameter tree in `params_dir`, for the error message."""
    missing = [name for name in _ORBAX_ENTRIES if not (params_dir / name).exists()]
    if missing:
        return f"{', '.join(missing)} missing (an incomplete or partly copied checkpoint)"
    return "no parameter metadata (a corrupt checkpoint)"


def _digests(params: dict) -> dict[str, str]:
    """SHA-256 of each parameter's bytes (C order, its stored dtype), by flattened name."""
    out = {}
    for name, x in _flatten(params).items():
        data = np.ascontiguousarray(jax.device_get(x))
        out[name] = hashlib.sha256(data.reshape(-1).view(np.uint8)).hexdigest()
    return out


def _write_checksums(path: Path, params: dict, config: bytes) -> None:
    record = {"algorithm": CHECKSUM_ALGORITHM, "parameters": _digests(params),
              "config": hashlib.sha256(config).hexdigest()}
    (path / CHECKSUMS_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def _read_checksums(path: Path) -> tuple[dict[str, str], str | None] | None:
    """The recorded parameter digests and config.json's digest (None: saved before configs
    were checksummed), or None for a checkpoint saved without checksums."""
    file = path / CHECKSUMS_FILE
    if not file.exists():
        return None
    try:
        record = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"corrupt checksum file {file}: {e}") from None
    digests = record.get("parameters") if isinstance(record, dict) else None
    config = record.get("config") if isinstance(record, dict) else None
    if (not isinstance(record, dict) or record.get("algorithm") != CHECKSUM_ALGORITHM
            or not isinstance(digests, dict)
            or not all(isinstance(v, str) for v in digests.values())
            or not (config is None or isinstance(config, str))):
        raise ValueError(f"corrupt checksum file {file}: expected {{\"algorithm\": "
                         f"\"{CHECKSUM_ALGORITHM}\", \"parameters\": {{name: hex digest}}, "
                         f"\"config\": hex digest}}")
    return digests, config


def _verify_config_checksum(path: Path, recorded: str | None, config: bytes) -> None:
    if recorded is not None and hashlib.sha256(config).hexdigest() != recorded:
        raise ValueError(f"checkpoint {path} is corrupt: {CONFIG_FILE} does not match the checksum "
                         f"recorded at save ({CHECKSUMS_FILE})")


def _verify_checksums(path: Path, recorded: dict[str, str], params: dict) -> None:
    actual = _digests(params)
    if set(recorded) != set(actual):
        unknown = sorted(set(recorded) ^ set(actual))
        raise ValueError(f"checksum file {path / CHECKSUMS_FILE} does not list this checkpoint's "
                         f"parameters (differs in {unknown[:5]}{' ...' if len(unknown) > 5 else ''})")
    bad = [name for name in sorted(actual) if actual[name] != recorded[name]]
    if bad:
        raise ValueError(f"checkpoint {path} is corrupt: parameter(s) {bad[:5]}"
                         f"{' ...' if len(bad) > 5 else ''} read from {PARAMS_DIR}/ do not match "
                         f"the checksums recorded at save ({CHECKSUMS_FILE})")


def _checkpointer():
    import orbax.checkpoint as ocp
    return ocp.StandardCheckpointer()


def _staging_dir(path: Path) -> Path:
    """A new folder for Orbax to write into: on `path`'s file system (what it writes is renamed
    into `path`), with no glob character in its full path (under a `[` Orbax skipped writing its
    data, with only a logged warning). Inside `path` where its path has none, else in the nearest
    folder above it without one."""
    base = next(p for p in (path, *path.parents) if not any(c in str(p) for c in _GLOB_CHARS))
    if base == path:
        return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=path))
    char = next(c for c in str(path) if c in _GLOB_CHARS)
    why = (f"cannot save to {path}: its path contains {char!r}, which Orbax reads as a glob pattern, "
           f"and the staging folder for Orbax cannot be made in {base}, the nearest folder above without one")
    if os.stat(base).st_dev != os.stat(path).st_dev:
        raise ValueError(f"{why}: it is on another file system; save to a path without any of "
                         f"{' '.join(_GLOB_CHARS)}")
    try:
        return Path(tempfile.mkdtemp(prefix=".dsd-saving-", dir=base))
    except OSError as e:
        raise ValueError(f"{why} ({e}); save to a path without any of {' '.join(_GLOB_CHARS)}") from None


def save(model: Transformer, path: str | os.PathLike, *, dtype: str | None = None,
         overwrite: bool = False) -> Path:
    """Saves `model` (its config and parameters) to the directory `path`.

    dtype: optionally cast the parameters first ("float32" or "bfloat16"); the saved
    config records the dtype the parameters are stored in.
    overwrite: replace an existing checkpoint at `path` (otherwise a non-empty directory is an
    error). A checkpoint of another kind there (a Hugging Face model, an EAGLE-3 head, files of
    no known format: `layout.checkpoint_kind`) is refused even so: use another directory.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"save expects a dsd_jax.models.Transformer, got {type(model).__name__}")
    path = Path(path).absolute()
    cfg: ModelConfig = model.config
    params = _pure_params(model)
    if dtype is not None:
        cfg = cfg.replace(dtype=dtype)  # validates the name
        params = jax.tree.map(lambda x: jnp.asarray(x, cfg.jnp_dtype), params)
    found = checkpoint_kind(path)
    if found.kind == "file":
        raise FileExistsError(f"checkpoint path {path} exists and is not a directory")
    if found.kind not in ("empty", "other", "dsd", "dsd-partial"):
        # even with overwrite: our config.json would replace its own and it would stop loading
        raise FileExistsError(f"{path} holds {found.what}, not a models.save checkpoint; save writes "
                              f"its own {CONFIG_FILE} and would make it unloadable: save into another "
                              "directory")
    if found.kind != "empty" and not overwrite:
        raise FileExistsError(f"checkpoint directory {path} is not empty (pass overwrite=True)")
    path.mkdir(parents=True, exist_ok=True)
    staging = _staging_dir(path)
    try:
        staged = staging / PARAMS_DIR
        ckptr = _checkpointer()
        try:
            ckptr.save(staged, params, force=True)
            ckptr.wait_until_finished()
        finally:
            ckptr.close()
        # Orbax reports some failed writes only as a logged warning: check before replacing anything
        if not ((staged / "_METADATA").is_file() and (staged / "manifest.ocdbt").is_file()
                and (staged / "d").is_dir()):
            raise RuntimeError(f"saving to {path} failed: Orbax wrote an incomplete parameter checkpoint "
                               f"({_metadata_problem(staged)}); nothing in {path} was replaced")
        old = path / PARAMS_DIR
        if old.exists() or old.is_symlink():
            os.replace(old, staging / "replaced")  # removed with the staging folder
        os.replace(staged, old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    config = (json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    _write_checksums(path, params, config)
    (path / CONFIG_FILE).write_bytes(config)
    return path


def load_config(path: str | os.PathLike) -> ModelConfig:
    path = Path(path)
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} is not a model checkpoint: {CONFIG_FILE} is missing")
    try:
        d = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"corrupt checkpoint config {cfg_file}: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"corrupt checkpoint config {cfg_file}: expected a JSON object")
    try:
        return ModelConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"invalid checkpoint config {cfg_file}: {e}") from None


def restore(path: str | os.PathLike, *, dtype: str | None = None, verify: bool = True) -> Transformer:
    """Restores the model saved at `path` (see `save`).

    dtype: optionally cast the restored parameters ("float32" or "bfloat16"); default:
    the dtype they were saved in.
    verify: check every parameter, and config.json, against `checksums.json` (one SHA-256 pass
    over the weights on the host; a corrupt data file is a ValueError naming the parameters).
    """
    path = Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"checkpoint path {path} is not a directory")
    cfg = load_config(path)
    recorded = _read_checksums(path) if verify else None
    params_dir = path / PARAMS_DIR
    if not params_dir.is_dir():
        raise FileNotFoundError(f"checkpoint {path} has no parameters: {PARAMS_DIR}/ is missing")

    abstract = nnx.eval_shape(lambda: init_model(cfg, 0))
    abs_state = nnx.state(abstract, nnx.Param)
    expected = _flatten(nnx.to_pure_dict(abs_state))

    if (params_dir / "manifest.ocdbt").exists() != (params_dir / "d").is_dir():
        # half an OCDBT checkpoint (manifest or data gone): Orbax would fail noisily in its event loop
        raise ValueError(f"cannot read the parameter checkpoint in {params_dir}: "
                         f"{_metadata_problem(params_dir)}")
    ckptr = _checkpointer()
    try:
        try:
            meta = ckptr.metadata(params_dir)
        except Exception as e:  # noqa: BLE001 - orbax raises various types for broken dirs
            raise ValueError(f"cannot read the parameter checkpoint in {params_dir}: {e}") from None
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        if not isinstance(tree, Mapping):
            raise ValueError(f"cannot read the parameter checkpoint in {params_dir}: "
                             f"{_metadata_problem(params_dir)}")
        found = _flatten(dict(tree))
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
            if extra:
                parts.append(f"unexpected {extra[:5]}{' ...' if len(extra) > 5 else ''}")
            raise ValueError(f"checkpoint {path} does not match its config: parameter tree has "
                             + "; ".join(parts))
        for name, want in expected.items():
            got = found[name]
            if tuple(got.shape) != tuple(want.shape):
                raise ValueError(f"checkpoint {path} does not match its config: parameter {name!r} "
                                 f"has shape {tuple(got.shape)}, config implies {tuple(want.shape)}")
            if jnp.dtype(got.dtype) != jnp.dtype(want.dtype):
                raise ValueError(f"checkpoint {path} does not match its config: parameter {name!r} "
                                 f"has dtype {jnp.dtype(got.dtype)}, config says {cfg.dtype}")
        # The placement is ours to give: without one Orbax places each array as it was saved
        # ("cpu:0" for the shipped pair), which fails on a machine without that device. New
        # arrays' device, as everywhere else (`jax.default_device` honoured).
        here = jax.sharding.SingleDeviceSharding(default_device())
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=here),
                              nnx.to_pure_dict(abs_state))
        try:
            pure = ckptr.restore(params_dir, target)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"cannot read the parameters in {params_dir}: {e}") from None
    finally:
        ckptr.close()
    if recorded is not None:
        # last, so that a hand-edited config's own error (a shape it implies) comes first
        _verify_config_checksum(path, recorded[1], (path / CONFIG_FILE).read_bytes())
        _verify_checksums(path, recorded[0], pure)

    model = nnx.eval_shape(lambda: init_model(cfg, 0))
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    if dtype is not None and dtype != cfg.dtype:
        model = cast(model, dtype)
    return model


def cast(model: Transformer, dtype: str) -> Transformer:
    """A copy of `model` with parameters (and config) in `dtype`."""
    cfg = model.config.replace(dtype=dtype)
    new = nnx.eval_shape(lambda: init_model(cfg, 0))
    state = nnx.state(new, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda x: jnp.asarray(x, cfg.jnp_dtype), _pure_params(model)))
    nnx.update(new, state)
    return new
