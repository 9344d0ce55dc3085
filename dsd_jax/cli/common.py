"""What every `dsd-jax` command does with its parsed flags before its own work: the
speculative config of --speculative-config and --method, the outputs and --backend checked
before any model loads, and the engine built from the flags."""

from __future__ import annotations

import os
import sys
from typing import Any

from dsd_jax import loading
from dsd_jax.cli.flags import error


DRAFT_FLAGS = (("--draft", "draft"), ("--hf-draft", "hf_draft"), ("--draft-synthetic", "draft_synthetic"))


def load_spec(cmd: str, args):
    """The SpecConfig of --speculative-config and --method, before any model is loaded; a
    draft model given to a method that drafts without one is refused (it would be loaded
    and dropped)."""
    given = next((flag for flag, attr in DRAFT_FLAGS if getattr(args, attr, None)), None)
    target = _target_kind(args)
    spec = _spec_of_flags(cmd, args, has_draft=bool(given) or target == "builtin")  # the built-in pair has one
    if given and not _needs_draft_flag(spec):
        head = " (its EAGLE-3 head is the speculative config's \"model\")" if spec.method == "eagle3" else ""
        error(cmd, given, f"speculative method {spec.method!r} drafts without a draft model{head}; leave "
              f"{given} out")
    if spec.method == "eagle3":  # before a custom target takes minutes and gigabytes to build
        loading.check_head_fits("--speculative-config", spec.model, target)
    return spec


def _target_kind(args) -> str:
    """"custom" where a flag names the target (a checkpoint or a synthetic model), else
    "builtin": the built-in pair, whose EAGLE-3 head is the default one."""
    return "custom" if args.target or args.hf_target or getattr(args, "synthetic", None) else "builtin"


def _spec_of_flags(cmd: str, args, has_draft: bool):
    from dsd_jax.config import SpecConfig
    method = getattr(args, "method", None)
    if args.speculative_config is None and method is not None:
        try:
            spec = SpecConfig(method=method)
        except ValueError as e:
            error(cmd, "--method", str(e))
        if _needs_draft_flag(spec) and not has_draft:
            error(cmd, "--draft", f"speculative method {spec.method!r} needs a draft model (--draft or --hf-draft)")
        return spec
    if args.speculative_config is None:
        if not has_draft:
            error(cmd, "--draft", "the default speculative method 'draft_model' needs a draft model: pass "
                  "--draft/--hf-draft, or --speculative-config '{\"method\": \"ngram\"}' (or \"none\")")
        return SpecConfig()
    if _spec_file(args):
        loading.existing_file("--speculative-config", args.speculative_config)
    value, problem = spec_value(args)
    if problem is not None:
        error(cmd, "--speculative-config", problem)
    raw = value if isinstance(value, dict) else None
    merge = method is not None and raw is not None and raw.get("method") is None
    if merge:  # a config that names no method takes --method's ("draft_model" is only the default)
        try:
            SpecConfig(method=method)
        except ValueError as e:
            error(cmd, "--method", str(e))
    try:
        spec = SpecConfig.from_dict({**raw, "method": method}) if merge else SpecConfig.from_dict(value)
    except ValueError as e:
        error(cmd, "--speculative-config", str(e))
    if method is not None and method != spec.method:
        error(cmd, "--method", f"{method!r} disagrees with the speculative config's method {spec.method!r}")
    if _needs_draft_flag(spec) and not has_draft:
        error(cmd, "--draft", f"speculative method {spec.method!r} needs a draft model (--draft or --hf-draft)")
    return spec


def _spec_file(args) -> str | None:
    """The --speculative-config file (None: none given, or JSON text)."""
    src = args.speculative_config
    return src if src is not None and not src.lstrip().startswith("{") else None


def spec_value(args) -> tuple[Any, str | None]:
    """(the speculative config's JSON value, None), or (None, why it cannot be read); (None,
    None) when none is given or its file is missing (`loading.existing_file` says so). A file
    is read once and kept on `args`: a pipe (/dev/stdin, <(...)) gives its text only once."""
    from dsd_jax.config import read_json_config
    src = args.speculative_config
    if src is None:
        return None, None
    kept = getattr(args, "_speculative_config_read", None)
    if kept is not None and kept[0] == src:
        return kept[1]
    if _spec_file(args) is not None and (not os.path.exists(src) or os.path.isdir(src)):
        return None, None
    try:  # JSON text, or the file read once here
        result = (read_json_config(src), None)
    except ValueError as e:
        result = (None, str(e))
    args._speculative_config_read = (src, result)
    return result


def spec_json(args) -> dict | None:
    """The speculative config's JSON object as given (None: none given, or not a readable JSON
    object; `_spec_of_flags` then says why)."""
    value = spec_value(args)[0]
    return value if isinstance(value, dict) else None


def check_outputs(cmd: str, args, outputs, inputs=(), keep=()) -> None:
    """Output paths up front, before any model is loaded: each a file name in a writable
    directory, none the same file as another output or an input (the inputs of every command:
    --speculative-config and the EAGLE-3 head it names, the model flags, and `inputs`), none in
    a checkpoint directory or in --compilation-cache-dir, and none an existing file unless
    --overwrite (or in `keep`: what a resumed run continues)."""
    for label, path in outputs:
        if path is not None:
            loading.output_file(label.partition(" ")[0], path)  # (the note is for an existing file)
    cache = args.compilation_cache_dir
    if cache:
        loading.output_dir("--compilation-cache-dir", cache)
    head = (spec_json(args) or {}).get("model")
    common = [("--speculative-config", _spec_file(args)),
              ("--speculative-config's model", head if isinstance(head, str) and head != "builtin" else None)]
    loading.check_outputs(outputs, list(inputs) + common + loading.model_inputs(args), overwrite=args.overwrite,
                          dirs=[("--compilation-cache-dir", cache)], keep=keep)


def check_backend(cmd: str, args) -> None:
    """--backend pallas on a CPU host, before any model is loaded (the kernel's own error
    advises arguments the CLI has no flags for)."""
    import jax
    if args.backend == "pallas" and jax.default_backend() == "cpu":
        error(cmd, "--backend", "the Pallas kernels compile for a GPU or TPU and this host runs on CPU: pass "
              "--backend interpret (the Pallas kernels interpreted, slow) or --backend xla")


def needs_draft(spec) -> bool:
    from dsd_jax import drafters
    return drafters.get(spec.method).needs_model


def _needs_draft_flag(spec) -> bool:
    """Whether --draft must be given: the method needs a model and cannot load the one its
    spec names itself (an EAGLE-3 head is loaded from `model`, the built-in by default)."""
    from dsd_jax import drafters
    return needs_draft(spec) and not hasattr(drafters.get(spec.method), "load_model")


def engine_draft(args, spec, draft, target):
    """The engine's `draft=`: for method "eagle3" the head the spec names (the built-in one by
    default, in the target's dtype), loaded here unless `draft` is it already; else the draft
    model."""
    from dsd_jax.models.eagle3 import Eagle3Config
    if spec.method != "eagle3" or isinstance(getattr(draft, "config", None), Eagle3Config):
        return draft
    return loading.draft_for(spec, draft, _target_kind(args), "--speculative-config",
                             target.config.dtype)


def make_engine(cmd: str, args, target, draft, tokenizer, spec, profile=None):
    from dsd_jax import SpecEngine
    from dsd_jax.sharding import make_mesh
    draft = engine_draft(args, spec, draft, target)
    try:
        mesh = None if args.mesh is None else make_mesh(*args.mesh)
    except ValueError as e:
        error(cmd, "--mesh", str(e))
    vocab = target.config.vocab_size
    for flag in ("top_logprobs", "prompt_logprobs"):  # named here, not as the engine's max_logprobs
        asked = getattr(args, flag, None) or 0
        if asked > vocab:
            error(cmd, "--" + flag.replace("_", "-"), f"at most the vocabulary's {vocab} ids, got {asked}")
    try:
        return SpecEngine(target, draft if needs_draft(spec) else None, spec,
                          max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
                          tokenizer=tokenizer, prefill_chunk=args.prefill_chunk, profile=profile,
                          backend=args.backend, compilation_cache_dir=args.compilation_cache_dir,
                          seed=args.seed or 0, mesh=mesh,
                          max_logprobs=max(getattr(args, "top_logprobs", None) or 0,
                                           getattr(args, "prompt_logprobs", None) or 0),
                          share_prefixes=getattr(args, "share_prefixes", True))
    except (ValueError, NotImplementedError) as e:
        error(cmd, None, f"cannot build the engine: {e}")


def progress_bar(args, total: int, desc: str, unit: str):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=True if args.no_progress else None)
