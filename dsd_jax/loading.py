"""From command-line inputs to library objects: model directories, tokenizers, prompt files.

`dsd_jax.cli` and `dsd_jax.bench.main` load what a user names on the command line
through these functions. Every problem is an `ArgumentError` that names the flag at
fault (``--target``, ``--prompts``, ...); the CLI turns it into its
``dsd-jax CMD: error: FLAG: message`` exit, a library caller gets a ``ValueError``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from typing import Any

import numpy as np

from dsd_jax.models.layout import atomic_write, writes_through  # re-exported: they live below the model layer
from dsd_jax.inputs import EOS_CANDIDATES, encode_text, tokenizer_eos_ids

__all__ = ["ArgumentError", "existing_file", "existing_dir", "output_file", "output_dir", "check_outputs",
           "atomic_write", "writes_through", "writing", "model_inputs",
           "load_models", "load_eagle3_head", "draft_for", "read_prompts", "encode_prompts", "eos_token_ids",
           "EOS_CANDIDATES"]


def json_safe(x):
    """`x` with every non-finite float (a failing kernel's NaN error, a ratio of nothing) as
    None, JSON's null: a bare NaN or Infinity is not JSON, and strict readers (jq,
    JSON.parse) refuse the file."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


class ArgumentError(ValueError):
    """A bad input, with the command-line flag it came from (None: no single flag)."""

    def __init__(self, flag: str | None, message: str):
        super().__init__(f"{flag}: {message}" if flag else message)
        self.flag, self.message = flag, message


# --------------------------------------------------------------------------- paths

def _existing(flag: str, path: str, what: str, is_kind) -> str:
    if not os.path.exists(path):
        raise ArgumentError(flag, f"no such {what}: {path!r}")
    if not is_kind(path):
        raise ArgumentError(flag, f"{path!r} is not a {what}")
    return path


def existing_file(flag: str, path: str) -> str:
    """An input `path` that exists and is not a directory: a regular file, or a pipe (a FIFO,
    /dev/stdin, a shell's <(...)) that the caller reads once."""
    if not os.path.exists(path):
        raise ArgumentError(flag, f"no such file: {path!r}")
    if os.path.isdir(path):
        raise ArgumentError(flag, f"{path!r} is a directory, not a file")
    return path


def existing_dir(flag: str, path: str) -> str:
    return _existing(flag, path, "directory", os.path.isdir)


def _cannot_make_files(directory: str) -> OSError | None:
    """Why no file can be made in `directory`, or None: a file is made and removed there
    (os.access says yes to root on a directory that refuses files, /proc)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        return e
    return None


def output_file(flag: str, path: str) -> str:
    # "dir/" (or "") would pass the checks below while dir does not exist yet, and the write
    # would fail only once the whole run is done
    if os.path.basename(path) in ("", ".", ".."):
        raise ArgumentError(flag, f"{path!r} names no file; give a file name")
    if os.path.isdir(path):
        raise ArgumentError(flag, f"{path!r} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ArgumentError(flag, f"the directory of {path!r} does not exist ({parent!r})")
    e = _cannot_make_files(parent)
    if e is not None:
        raise ArgumentError(flag, f"cannot write a file in the directory of {path!r} ({parent!r}): "
                            f"{e.strerror or e}") from e
    try:  # a legal path whose name is too long failed only when written, after the run
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(os.path.basename(path))) > name_max:
        raise ArgumentError(flag, f"{path!r}: the file name is longer than the {name_max} bytes its "
                            "file system allows")
    return path


@contextlib.contextmanager
def writing(flag: str, path: str | os.PathLike):
    """Turns an OSError of writing `path` into an `ArgumentError` naming `flag`."""
    try:
        yield
    except OSError as e:
        raise ArgumentError(flag, f"cannot write {os.fspath(path)!r}: {e.strerror or e} (a file already "
                            "there is left as it was)") from e


def _file_key(path: str):
    """Equal for two paths of one file: the inode of an existing file (hard links, symlinks),
    else the resolved path."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(path))


def _output_label(label: str, path: str) -> tuple[str, str]:
    """(flag, path quoted with the label's note) of a `check_outputs` label."""
    flag, _, note = label.partition(" ")
    return flag, f"{path!r}" + (f" ({note})" if note else "")


def _inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies under it (symlinks resolved)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def check_outputs(outputs, inputs=(), overwrite: bool = False, dirs=(), keep=()) -> None:
    """Refuses an output file that is also another output or an input of the run, or lies in
    an input directory (a checkpoint) or in an output directory (`dirs`), and (unless
    `overwrite`) one that exists: a run must not destroy its own input or an earlier result.

    outputs, inputs, dirs: (flag, path) pairs, path None for a flag not given. An input
    that is a directory counts with everything under it. dirs: directories the run writes
    into (a compilation cache); none may lie in an input directory. An output's flag may be
    followed by a note on what is written there ("--json the profile saved beside it"); the
    error names the flag and quotes the note. keep: output paths the run continues (a
    resumed run's records), which may exist."""
    inputs = [(flag, path) for flag, path in inputs if path is not None]
    in_dirs = [(flag, path) for flag, path in inputs if os.path.isdir(path)]
    in_files = [(flag, _file_key(path)) for flag, path in inputs if not os.path.isdir(path)]
    dirs = [(flag, path) for flag, path in dirs if path is not None]
    for flag, path in dirs:
        for other, d in in_dirs:
            if _inside(path, d):
                raise ArgumentError(flag, f"{path!r} is in the directory of {other} ({d!r}): the run "
                                    "would write into its own input")
    earlier: list[tuple[str, Any]] = []
    for label, path in outputs:
        if path is None:
            continue
        flag, where = _output_label(label, path)
        key = _file_key(path)
        for other, other_key in in_files:
            if key == other_key:
                raise ArgumentError(flag, f"{where} is the input file of {other}: the run would overwrite "
                                    "its own input")
        for other, d in in_dirs:
            if _inside(path, d):
                raise ArgumentError(flag, f"{where} is in the directory of {other} ({d!r}): the run would "
                                    "overwrite its own input")
        for other, d in dirs:
            if _inside(path, d):
                raise ArgumentError(flag, f"{where} is in the directory of {other} ({d!r}): give an output "
                                    "file outside it")
        for other, other_key in earlier:
            if key == other_key:
                raise ArgumentError(flag, f"{where} is also the output file of {other}: give each output "
                                    "a file of its own")
        earlier.append((flag, key))
    for label, path in outputs:  # (a descriptor or device is appended to: nothing is replaced)
        if (path is not None and not overwrite and os.path.exists(path) and not writes_through(path)
                and path not in keep):
            flag, where = _output_label(label, path)
            raise ArgumentError(flag, f"{where} exists; pass --overwrite to replace it")


def output_dir(flag: str, path: str) -> str:
    """A directory the run writes into, made if missing: refused up front (before any model
    loads) where it is not a directory, or where it cannot be made: its nearest existing
    ancestor must be a directory in which a file can be made."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentError(flag, f"{path!r} exists and is not a directory")
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):  # "/" exists: the loop ends
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ArgumentError(flag, f"cannot make the directory {path!r}: {ancestor!r} is not a directory")
    e = _cannot_make_files(ancestor)
    if e is not None:
        what = "write in" if ancestor == os.path.abspath(path) else "make the directory"
        raise ArgumentError(flag, f"cannot {what} {path!r}: no file can be made in {ancestor!r} "
                            f"({e.strerror or e})") from e
    return path


# --------------------------------------------------------------------------- models

# where a checkpoint of each kind goes, for a directory passed to the wrong flag
_KIND_FLAGS = {"dsd": "--target/--draft", "hf": "--hf-target/--hf-draft",
               "eagle3": '--speculative-config \'{"method": "eagle3", "model": DIR}\' (or bench --eagle3 DIR)'}


def _load_checkpoint(flag: str, path: str, hf: bool, dtype: str):
    from dsd_jax import models
    from dsd_jax.models.layout import KIND_NAMES, checkpoint_kind
    existing_dir(flag, path)
    kind = checkpoint_kind(path).kind
    if kind in _KIND_FLAGS and kind != ("hf" if hf else "dsd"):  # each loader's own error would mislead
        raise ArgumentError(flag, f"{path!r} holds {KIND_NAMES[kind]}: pass it as {_KIND_FLAGS[kind]}")
    try:
        if hf:
            return models.load_hf(path, dtype=dtype)
        return models.restore(path, dtype=None if dtype == "auto" else dtype)  # None: as saved
    except (OSError, ValueError, TypeError) as e:
        raise ArgumentError(flag, f"cannot load the model in {path!r}: {e}") from e


def _builtin_pair(dtype: str):
    try:
        from dsd_jax.models import builtin
        return builtin(dtype=dtype)
    except (ImportError, OSError, ValueError) as e:
        raise ArgumentError("--target", f"the built-in model pair is not available ({e}); pass --target/--draft "
                            "(dsd_jax.models.save checkpoints) or --hf-target/--hf-draft") from e


def load_tokenizer_flag(path: str):
    """--tokenizer's tokenizer.json, or an error naming the flag."""
    existing_file("--tokenizer", path)
    try:
        from tokenizers import Tokenizer
        return Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001
        raise ArgumentError("--tokenizer", f"cannot read {path!r}: {e}") from e


def _hf_tokenizer(path: str):
    """The tokenizer.json of an HF directory, None without one. One that is there but cannot be
    read is an error: dropping it would also drop the end-of-text stop ids."""
    from dsd_jax import models
    try:
        return models.load_tokenizer(path)
    except (OSError, ValueError) as e:  # its message names the file and the cause
        raise ArgumentError("--hf-target", f"{e} (fix it, or pass --tokenizer FILE)") from e


MODEL_FLAGS = ("target", "draft", "hf_target", "hf_draft", "tokenizer")


def model_inputs(options) -> list[tuple[str, str | None]]:
    """(flag, path) of each model input `load_models` reads from `options`, for `check_outputs`."""
    return [("--" + k.replace("_", "-"), getattr(options, k, None)) for k in MODEL_FLAGS]


def load_models(options):
    """(target, draft or None, tokenizer or None, source), source "builtin" or "custom".

    options: anything with the CLI's model attributes ``target``, ``draft`` (directories
    of `dsd_jax.models.save`), ``hf_target``, ``hf_draft`` (Hugging Face safetensors
    directories), ``tokenizer`` (a tokenizer.json) and ``dtype``; missing ones are None
    (dtype "auto"). dtype "auto": each checkpoint's own (an HF config's torch_dtype, see
    `models.hf.checkpoint_dtype`; a saved checkpoint's), the built-in pair's float32.
    Neither target given: the built-in pair."""
    target_dir, draft_dir, hf_target, hf_draft, tokenizer_path = (getattr(options, k, None) for k in MODEL_FLAGS)
    dtype = getattr(options, "dtype", None) or "auto"
    if target_dir and hf_target:
        raise ArgumentError("--target", "give --target or --hf-target, not both")
    if draft_dir and hf_draft:
        raise ArgumentError("--draft", "give --draft or --hf-draft, not both")
    tokenizer, draft, source = None, None, "custom"
    if target_dir or hf_target:
        hf = bool(hf_target)
        target = _load_checkpoint("--hf-target" if hf else "--target", hf_target or target_dir, hf, dtype)
        if hf and not tokenizer_path:
            tokenizer = _hf_tokenizer(hf_target)
    else:
        if draft_dir or hf_draft:
            raise ArgumentError("--target", "a custom draft needs a custom target (--target or --hf-target)")
        target, draft, tokenizer = _builtin_pair("float32" if dtype == "auto" else dtype)
        source = "builtin"
    if draft_dir or hf_draft:
        hf = bool(hf_draft)
        draft = _load_checkpoint("--hf-draft" if hf else "--draft", hf_draft or draft_dir, hf, dtype)
    if tokenizer_path:
        tokenizer = load_tokenizer_flag(tokenizer_path)
    return target, draft, tokenizer, source


def check_head_fits(flag: str, path, source: str) -> None:
    """Refuses the built-in EAGLE-3 head (`path` None or "builtin") for a target that is not
    the built-in one (`source` other than "builtin"); callers check before loading models."""
    if path in (None, "builtin") and source != "builtin":
        raise ArgumentError(flag, "the built-in EAGLE-3 head was trained for the built-in target; with a "
                            "custom target give a head trained for it (an EAGLE-3 head directory)")


def load_eagle3_head(flag: str, path, source: str = "builtin", dtype: str = "float32"):
    """The EAGLE-3 head in `path` (a head directory, or None / "builtin": the one shipped for
    the built-in target, only with the built-in models: source "builtin")."""
    from dsd_jax.models import load_eagle3
    check_head_fits(flag, path, source)
    if path in (None, "builtin"):
        path = "builtin"
    else:
        existing_dir(flag, os.fspath(path))
    try:
        return load_eagle3(path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise ArgumentError(flag, f"cannot load the EAGLE-3 head {os.fspath(path)!r}: {e}") from e


def draft_for(spec, draft, source: str, flag: str = "--speculative-config", dtype: str = "float32"):
    """What an engine running `spec` takes as `draft=`: the EAGLE-3 head `spec.model` names
    for method "eagle3" (default "builtin"), the draft model for methods that need one, else
    None. `draft` is the draft model `load_models` gave."""
    from dsd_jax import drafters
    if spec.method == "eagle3":
        return load_eagle3_head(flag, spec.model, source, dtype)
    if not drafters.get(spec.method).needs_model:
        return None
    if draft is None:
        raise ArgumentError("--draft", f"speculative method {spec.method!r} needs a draft model "
                            "(--draft or --hf-draft)")
    return draft


def eos_token_ids(tokenizer, hf_checkpoint: str | None = None, vocab_size: int | None = None) -> list[int]:
    """The ids generation stops at: the end-of-text ids the tokenizer knows
    (`inputs.tokenizer_eos_ids`), then the `eos_token_id`s of a Hugging Face checkpoint directory
    (generation_config.json, config.json; ids in [0, vocab_size)), which may name tokens no
    candidate does (Llama-3.1-Instruct's <|eom_id|>). An unreadable one is an ArgumentError
    of --hf-target."""
    out = tokenizer_eos_ids(tokenizer)
    if hf_checkpoint:
        if vocab_size is None:
            raise ValueError("eos_token_ids: a checkpoint's ids are checked against the vocabulary: "
                             "give vocab_size with hf_checkpoint")
        from dsd_jax.models.hf import checkpoint_eos_ids
        try:
            own = checkpoint_eos_ids(hf_checkpoint, vocab_size)
        except (OSError, ValueError) as e:
            raise ArgumentError("--hf-target", f"cannot read the end-of-text ids in {hf_checkpoint!r}: {e}") from e
        out += [t for t in own if t not in out]
    return out


# --------------------------------------------------------------------------- prompts

def _read_text(flag: str, path: str | None) -> tuple[str, str]:
    """(text, name for messages) of a prompt file, or of stdin for None or "-"."""
    if path is None or path == "-":
        if path is None and sys.stdin.isatty():
            raise ArgumentError(flag, "no prompts: pass --prompts FILE or pipe prompts on stdin")
        raw = getattr(sys.stdin, "buffer", None)
        if raw is None:  # a text stream that replaced sys.stdin (tests): already decoded
            return sys.stdin.read().removeprefix("\ufeff"), "stdin"
        try:  # UTF-8 whatever the locale, as a file is read; -sig: a BOM is not text
            return raw.read().decode("utf-8-sig"), "stdin"
        except (OSError, UnicodeDecodeError) as e:
            raise ArgumentError(flag, f"cannot read stdin: {e}") from e
    existing_file(flag, path)
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a BOM (Windows editors) is not text
            return f.read(), repr(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ArgumentError(flag, f"cannot read {path!r}: {e}") from e


PROMPT_KEYS = ("prompt", "prompt_token_ids")


def _jsonl_prompt(flag: str, where: str, line: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ArgumentError(flag, f"{where}: invalid JSON ({e})") from e
    if not isinstance(obj, dict) or ("prompt" in obj) == ("prompt_token_ids" in obj):
        raise ArgumentError(flag, f"{where}: expected an object with exactly one of "
                            "\"prompt\" (string) or \"prompt_token_ids\" (list of ints)")
    # a per-prompt "max_tokens" or "temperature" would otherwise be dropped without a word
    unknown = sorted(k for k in obj if k not in PROMPT_KEYS)
    if unknown:
        names = ", ".join(json.dumps(k) for k in unknown)
        raise ArgumentError(flag, f"{where}: unknown key{'s' * (len(unknown) > 1)} {names}: a line holds "
                            "only \"prompt\" or \"prompt_token_ids\"; sampling settings come from the "
                            "command-line flags (--max-tokens, --temperature, ...) for every prompt")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise ArgumentError(flag, f"{where}: \"prompt\" must be a non-empty string")
        return {"prompt": obj["prompt"]}
    ids = obj["prompt_token_ids"]
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
        raise ArgumentError(flag, f"{where}: \"prompt_token_ids\" must be a non-empty list of "
                            "non-negative integers")
    return {"prompt_token_ids": ids}


def _check_text(flag: str, where: str, text: str) -> None:
    from dsd_jax.inputs import check_text
    try:
        check_text(text, where)
    except ValueError as e:
        raise ArgumentError(flag, str(e)) from None


PROMPT_FORMATS = ("auto", "text", "jsonl")


def _lines(text: str) -> list[str]:
    """text split at "\\n", "\\r\\n" and "\\r" only (universal newlines), without the breaks.
    Not `str.splitlines`: it also splits at a form feed, U+2028 and other characters a
    prompt (or a JSON string, which may hold them raw) can contain."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def read_prompts(flag: str, path: str | None, fmt: str = "auto", with_lines: bool = False):
    """Prompts as dicts {"prompt": str} or {"prompt_token_ids": [...]}.

    fmt "jsonl": one object per line with "prompt" or "prompt_token_ids" and no other key;
    "text": every non-blank line is one text prompt (its line break removed); "auto": JSONL
    when the first non-blank line starts with '{' or the file is named *.jsonl, else text.
    Lines end at "\\n", "\\r\\n" or "\\r" only. None or "-" reads stdin.
    with_lines: return (prompts, where) instead, where[i] naming prompt i's file and line
    ("'p.txt' line 3"), for messages (`encode_prompts` names=).
    """
    if fmt not in PROMPT_FORMATS:
        raise ValueError(f"prompt format must be one of {PROMPT_FORMATS}, got {fmt!r}")
    text, name = _read_text(flag, path)
    lines = _lines(text)
    first = next((ln for ln in lines if ln.strip()), "")
    jsonl = fmt == "jsonl" or (fmt == "auto" and (first.lstrip().startswith("{")
                                                  or (path or "").endswith(".jsonl")))
    numbered = [(f"{name} line {i}", line) for i, line in enumerate(lines, 1) if line.strip()]
    where = [w for w, _ in numbered]
    try:
        out = [_jsonl_prompt(flag, w, line) if jsonl else {"prompt": line} for w, line in numbered]
    except ArgumentError as e:
        if fmt != "auto":
            raise
        raise ArgumentError(flag, f"{e.message} (read as JSONL because its first line starts "
                            "with '{' or it is named *.jsonl; for one text prompt a line, pass "
                            "--prompt-format text)") from e
    for w, p in zip(where, out):
        if "prompt" in p:
            _check_text(flag, w, p["prompt"])
    if not out:
        raise ArgumentError(flag, f"no prompts in {name}")
    return (out, where) if with_lines else out


def encode_prompts(prompts, tokenizer, vocab: int | None = None, flag: str | None = None,
                   names=None) -> list[list[int]]:
    """Token ids of each prompt: a string, a list of token ids, or a `read_prompts` dict.

    vocab: when given, every id must lie in [0, vocab). flag: the option the prompts came
    from (it also adds how to give token ids to the no-tokenizer message). names: what to
    call prompt i in messages (default "prompt i")."""
    out = []
    for i, p in enumerate(prompts):
        name = names[i] if names is not None else f"prompt {i}"
        if isinstance(p, dict):
            p = p["prompt_token_ids"] if "prompt_token_ids" in p else p["prompt"]
        if isinstance(p, str):
            if tokenizer is None:
                raise ArgumentError(flag, "text prompts need a tokenizer" + (
                    " (--tokenizer FILE, or use JSONL with \"prompt_token_ids\")" if flag else ""))
            ids = encode_text(tokenizer, p)
            if not ids:
                raise ArgumentError(flag, f"{name} encodes to no tokens")
        else:
            ids = [int(t) for t in p]
            if not ids:
                raise ArgumentError(flag, f"{name} is empty")
        if vocab is not None and (min(ids) < 0 or max(ids) >= vocab):
            raise ArgumentError(flag, f"{name} has token ids outside [0, {vocab})")
        out.append(ids)
    if not out:
        raise ArgumentError(flag, "no prompts")
    return out
