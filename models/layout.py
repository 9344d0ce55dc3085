"""What kind of checkpoint a directory holds, and the file names the checkpoint formats use.

Every writer asks `checkpoint_kind` before it writes into a directory (`models.save`,
`save_hf`, `save_eagle3`, the training scripts): the formats share `config.json`, so a saver
writing its own into another format's checkpoint would leave that one unloadable. One rule
here, rather than one per saver, so that they cannot disagree. This module imports no other
model module, so that any of them can import it.

Kinds (`checkpoint_kind(path).kind`):

    "empty"        no such path, or an empty directory (but for a crashed save's staging folder)
    "file"         a path that is not a directory
    "dsd"          a `models.save` checkpoint: its config.json (a ModelConfig dict) and params/
    "dsd-partial"  what an interrupted (or damaged) `models.save` leaves: params/ or
                   checksums.json with no config.json, or its config.json with no params/
    "hf"           a Hugging Face model: a config.json naming `architectures` other than
                   EAGLE-3's (or only a `model_type`), with or without its weights
    "eagle3"       an EAGLE-3 head: a config.json naming `EAGLE3_ARCHITECTURE`
    "unknown"      checkpoint files of none of these: weights with no config.json, a
                   config.json that is unreadable or of no known format, two formats mixed
    "other"        a directory holding none of these files (a tokenizer.json alone counts as
                   none: no model reads it): a saver writes beside them and replaces nothing
"""

from __future__ import annotations

import json
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Callable, NamedTuple

CONFIG_FILE = "config.json"
PARAMS_DIR = "params"            # models.save
CHECKSUMS_FILE = "checksums.json"  # models.save
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG_FILE = "generation_config.json"
STAGING_PREFIX = ".saving-"  # `models.save`'s folder for Orbax's write, inside the checkpoint
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"

KINDS = ("empty", "file", "dsd", "dsd-partial", "hf", "eagle3", "unknown", "other")
# What each saver's own checkpoint is called in its refusals.
KIND_NAMES = {"dsd": "a models.save checkpoint", "hf": "a Hugging Face checkpoint",
              "eagle3": "an EAGLE-3 head"}


class Found(NamedTuple):
    kind: str   # one of KINDS
    what: str   # what is there, for an error message ("a models.save checkpoint (params/, ...)")


def _present(path: Path, name: str) -> bool:
    p = path / name
    return p.exists() or p.is_symlink()  # a dangling link is still something a save would replace


def _shown(name: str) -> str:
    return name + "/" if name == PARAMS_DIR else name


def _read_config(file: Path) -> dict | str:
    """The config as a dict, or why it is not one."""
    try:
        d = json.loads(file.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        return f"{type(e).__name__}: {e}"
    return d if isinstance(d, dict) else f"a JSON {type(d).__name__}"


def _is_dsd_config(d: dict) -> bool:
    # ModelConfig.to_dict: `num_layers` where Hugging Face configs say `num_hidden_layers`,
    # and no `architectures` (structural, so that this module needs no ModelConfig import)
    return "num_layers" in d and "architectures" not in d and "num_hidden_layers" not in d


def checkpoint_kind(path: str | os.PathLike) -> Found:
    """Which kind of checkpoint (see the module doc) the directory `path` holds."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return Found("empty", "nothing")
    if not path.is_dir():
        return Found("file", "a file, not a directory")
    # a staging folder a crashed `models.save` left behind is not a checkpoint (save removes
    # its own when it ends; one left would otherwise make the next save need overwrite=True)
    entries = sorted(p.name for p in path.iterdir() if not (p.name.startswith(STAGING_PREFIX) and p.is_dir()))
    if not entries:
        return Found("empty", "an empty directory")
    dsd = [_shown(n) for n in (PARAMS_DIR, CHECKSUMS_FILE) if _present(path, n)]
    weights = [n for n in (WEIGHTS_FILE, WEIGHTS_INDEX_FILE) if _present(path, n)]
    tokenizer = [TOKENIZER_FILE] if _present(path, TOKENIZER_FILE) else []

    if not _present(path, CONFIG_FILE):
        if dsd and weights:
            return Found("unknown", f"files of two checkpoint formats ({', '.join(dsd + weights)})")
        if dsd:
            return Found("dsd-partial", f"an incomplete models.save checkpoint ({', '.join(dsd)} "
                                        f"with no {CONFIG_FILE})")
        if weights:
            return Found("unknown", f"{', '.join(weights)} with no {CONFIG_FILE}")
        more = ", ..." if len(entries) > 5 else ""
        return Found("other", f"files of no checkpoint ({', '.join(entries[:5])}{more})")

    cfg = _read_config(path / CONFIG_FILE)
    if isinstance(cfg, str):
        return Found("unknown", f"a {CONFIG_FILE} that is not a readable JSON object ({cfg})")
    if _is_dsd_config(cfg):
        if weights:
            return Found("unknown", f"files of two checkpoint formats (a models.save {CONFIG_FILE}, "
                                    f"{', '.join(dsd + weights)})")
        if not (path / PARAMS_DIR).is_dir() or not (path / CONFIG_FILE).is_file():
            return Found("dsd-partial", f"an incomplete models.save checkpoint ({', '.join(dsd + [CONFIG_FILE])}, "
                                        f"no {PARAMS_DIR}/ directory)")
        return Found("dsd", f"a models.save checkpoint ({', '.join(dsd + [CONFIG_FILE])})")
    archs = cfg.get("architectures")
    if archs is None and "model_type" not in cfg:
        return Found("unknown", f"a {CONFIG_FILE} of no known checkpoint format (no architectures or "
                                "model_type, not a models.save config)")
    names = f"architectures {archs!r}" if archs is not None else f"model_type {cfg['model_type']!r}"
    if dsd:
        return Found("unknown", f"files of two checkpoint formats ({', '.join(dsd)}, a {CONFIG_FILE} "
                                f"naming {names})")
    if isinstance(archs, list) and EAGLE3_ARCHITECTURE in archs:
        return Found("eagle3", f"an EAGLE-3 head ({', '.join([CONFIG_FILE] + weights)})")
    files = f" ({', '.join(weights + tokenizer)})" if weights or tokenizer else ""
    return Found("hf", f"a Hugging Face checkpoint{files} whose {CONFIG_FILE} names {names}")


_DESCRIPTOR = re.compile(r"^/(dev/(stdin|stdout|stderr|fd/)|proc/[^/]+/fd/)")


def writes_through(path: str | os.PathLike) -> bool:
    """Whether an output at `path` is written in place (appended to), not replaced by a new
    file: a process's descriptor (/dev/stdout, /dev/fd/N, /proc/self/fd/N: the file or pipe
    behind it is whoever opened it, `>> log` or `| cat`) or what is not a regular file (a
    device such as /dev/null, a FIFO)."""
    path = os.path.abspath(os.fspath(path))
    if _DESCRIPTOR.match(path) or _DESCRIPTOR.match(os.path.realpath(path)):
        return True
    return os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode)


def atomic_write(path: str | os.PathLike, write: Callable, mode: str = "w") -> None:
    """Calls ``write(f)`` on a temporary file beside `path`, then renames it over `path`: a
    failed write (a full disk) leaves an earlier file there whole, and no half-written one.
    (Here, below the model layer, so that the savers need not import the CLI's modules;
    `dsd_jax.loading` re-exports it.)

    A symbolic link's target is written (the link stays), and what `writes_through` is
    appended to in place: a rename would have replaced the link, a device, or the file
    behind /dev/stdout (`>> log`) with a plain file."""
    if writes_through(path):
        with open(path, mode.replace("w", "a"), **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
        return
    path = os.path.realpath(os.fspath(path))
    # a short name of its own: the path's name plus a suffix could pass the file system's limit
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


__all__ = ["checkpoint_kind", "Found", "KINDS", "atomic_write", "writes_through"]
