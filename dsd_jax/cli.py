"""The `dsd-jax` command line: `profile`, `generate`, `bench`, `demo`.

    dsd-jax profile --target T --draft D --context-lengths 128,512 --out profile.json
    dsd-jax profile --synthetic llama-3.1-8b --draft-synthetic llama-3.2-1b --acceptance 0.68,0.39,0.2,0.1
    dsd-jax generate --prompts prompts.txt --profile profile.json --temperature 0 > out.jsonl
    dsd-jax bench --quick --json bench.json
    dsd-jax demo --out-dir ./dsd_jax_demo

Models: `--target DIR` / `--draft DIR` are checkpoints written by
`dsd_jax.models.save`; `--hf-target DIR` / `--hf-draft DIR` are local Hugging Face
safetensors directories (`dsd_jax.models.load_hf`); with neither, the built-in pair
(`dsd_jax.models.builtin()`). Everything runs in this process (no subprocess, no
shell). Every bad argument is a `SystemExit` whose message names the flag; what the
library finds wrong with an input (`dsd_jax.loading.ArgumentError`: a missing directory,
a bad prompt file) `main` turns into the same exit. No command writes an output over one of its
inputs (or into a model directory or the compilation cache) or over another output, or replaces
an existing file without `--overwrite` (`demo`: the files it writes in --out-dir); all of that, and
that each output's directory takes files, is checked before any model is loaded, and an
output is written to a temporary file renamed over it, so a failed write loses no earlier
result. The commands parse flags and call into
the library (`dsd_jax.loading`, `dsd_jax.profiler`, `dsd_jax.bench`); nothing imports
this module.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from dsd_jax import loading, records
from dsd_jax.map_budget import MapLimitError
from dsd_jax.models.argtypes import int_at_least, nonneg_int, positive_int

__all__ = ["main", "build_parser"]


# --------------------------------------------------------------------------- errors

def _fail(cmd: str, flag: str | None, msg: str):
    where = f"{flag}: " if flag else ""
    raise SystemExit(f"dsd-jax {cmd}: error: {where}{msg}")


# --------------------------------------------------------------------------- argparse types

def _number_list(convert, what: str, low=-math.inf):
    """An argparse type: a non-empty comma-separated list of finite `convert(item)`s >= low."""
    def parse(text: str) -> list:
        try:
            out = [convert(x) for x in text.split(",") if x.strip()]
        except ValueError:
            out = []
        if not out or any(not math.isfinite(x) or x < low for x in out):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        return out
    return parse


_int_list = _number_list(int, "integers")
_float_list = _number_list(float, "finite numbers")
_nonneg_float_list = _number_list(float, "finite numbers >= 0", low=0.0)


def _logit_bias(text: str) -> dict[int, float]:
    """ID=BIAS,ID=BIAS: token ids and the biases added to their logits (ranges: `SamplingParams`)."""
    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        token, _, bias = item.partition("=")
        try:
            token, bias = int(token), float(bias)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected ID=BIAS,ID=BIAS,... (integer ids, numeric biases), "
                                             f"got {item!r}") from None
        if token in out:
            raise argparse.ArgumentTypeError(f"token id {token} is given twice")
        out[token] = bias
    if not out:
        raise argparse.ArgumentTypeError(f"expected ID=BIAS,ID=BIAS,..., got {text!r}")
    return out


def _str_list(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return out


SEED_LIMIT = 2 ** 32  # seeds are taken modulo this: a larger one would repeat a smaller one's samples
_seed = int_at_least(0, "an integer in [0, 2**32 - 1]", SEED_LIMIT - 1)


# --------------------------------------------------------------------------- shared setup

def _add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models (default: the built-in pair)")
    g.add_argument("--target", metavar="DIR", help="target checkpoint saved by dsd_jax.models.save")
    g.add_argument("--draft", metavar="DIR", help="draft checkpoint saved by dsd_jax.models.save")
    g.add_argument("--hf-target", metavar="DIR", help="target: local Hugging Face safetensors directory")
    g.add_argument("--hf-draft", metavar="DIR", help="draft: local Hugging Face safetensors directory")
    g.add_argument("--tokenizer", metavar="FILE", help="tokenizer.json (default: the HF dir's or the "
                   "built-in one)")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="parameter dtype (default auto: each checkpoint's own, bfloat16 where its config "
                        "says so; float32 for the built-in pair, bfloat16 for --synthetic; an EAGLE-3 head "
                        "takes the target's)")


def _mesh_shape(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdecimal() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected DATAxMODEL with positive integers (e.g. 1x4), got {text!r}")
    return int(parts[0]), int(parts[1])


def _add_engine_flags(p: argparse.ArgumentParser, max_batch: int, max_seq: int) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--speculative-config", metavar="JSON",
                   help="vLLM-style speculative config: a JSON string or a path to a JSON file "
                        "(default: draft model, num_speculative_tokens 4)")
    g.add_argument("--method", metavar="NAME",
                   help="speculative method, e.g. eagle3 (the built-in head unless the speculative "
                        "config names \"model\"): short for --speculative-config '{\"method\": NAME}', "
                        "or the method of a --speculative-config that names none")
    g.add_argument("--max-batch-size", type=positive_int, default=max_batch,
                   help=f"live request slots (default {max_batch})")
    g.add_argument("--max-seq-len", type=positive_int, default=max_seq,
                   help=f"prompt + output tokens per request (default {max_seq})")
    g.add_argument("--prefill-chunk", type=positive_int, default=256, help="prompt chunk (default 256)")
    g.add_argument("--backend", choices=("auto", "xla", "pallas", "interpret"), default="auto",
                   help="kernel backend (default auto)")
    g.add_argument("--compilation-cache-dir", metavar="DIR",
                   help="persistent XLA compilation cache (makes the next start fast)")
    g.add_argument("--seed", type=_seed, default=None,
                   help="sampling seed in [0, 2**32 - 1] (request i uses seed + i)")
    g.add_argument("--mesh", type=_mesh_shape, metavar="DATAxMODEL",
                   help="run on a device mesh, e.g. 1x4: tensor parallel over 4 devices (default: one device)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


DRAFT_FLAGS = (("--draft", "draft"), ("--hf-draft", "hf_draft"), ("--draft-synthetic", "draft_synthetic"))


def _load_spec(cmd: str, args):
    """The SpecConfig of --speculative-config and --method, before any model is loaded; a
    draft model given to a method that drafts without one is refused (it would be loaded
    and dropped)."""
    given = next((flag for flag, attr in DRAFT_FLAGS if getattr(args, attr, None)), None)
    custom = args.target or args.hf_target or getattr(args, "synthetic", None)
    spec = _spec_of_flags(cmd, args, has_draft=bool(given or not custom))  # the built-in pair has one
    if given and not _needs_draft_flag(spec):
        head = " (its EAGLE-3 head is the speculative config's \"model\")" if spec.method == "eagle3" else ""
        _fail(cmd, given, f"speculative method {spec.method!r} drafts without a draft model{head}; leave "
              f"{given} out")
    if spec.method == "eagle3":  # before a custom target takes minutes and gigabytes to build
        loading.check_head_fits("--speculative-config", spec.model, "custom" if custom else "builtin")
    return spec


def _spec_of_flags(cmd: str, args, has_draft: bool):
    from dsd_jax.config import SpecConfig
    method = getattr(args, "method", None)
    if args.speculative_config is None and method is not None:
        try:
            spec = SpecConfig(method=method)
        except ValueError as e:
            _fail(cmd, "--method", str(e))
        if _needs_draft_flag(spec) and not has_draft:
            _fail(cmd, "--draft", f"speculative method {spec.method!r} needs a draft model (--draft or --hf-draft)")
        return spec
    if args.speculative_config is None:
        if not has_draft:
            _fail(cmd, "--draft", "the default speculative method 'draft_model' needs a draft model: pass "
                  "--draft/--hf-draft, or --speculative-config '{\"method\": \"ngram\"}' (or \"none\")")
        return SpecConfig()
    if _spec_file(args):
        loading.existing_file("--speculative-config", args.speculative_config)
    value, error = _spec_value(args)
    if error is not None:
        _fail(cmd, "--speculative-config", error)
    raw = value if isinstance(value, dict) else None
    merge = method is not None and raw is not None and raw.get("method") is None
    if merge:  # a config that names no method takes --method's ("draft_model" is only the default)
        try:
            SpecConfig(method=method)
        except ValueError as e:
            _fail(cmd, "--method", str(e))
    try:
        spec = SpecConfig.from_dict({**raw, "method": method}) if merge else SpecConfig.from_dict(value)
    except ValueError as e:
        _fail(cmd, "--speculative-config", str(e))
    if method is not None and method != spec.method:
        _fail(cmd, "--method", f"{method!r} disagrees with the speculative config's method {spec.method!r}")
    if _needs_draft_flag(spec) and not has_draft:
        _fail(cmd, "--draft", f"speculative method {spec.method!r} needs a draft model (--draft or --hf-draft)")
    return spec


def _spec_file(args) -> str | None:
    """The --speculative-config file (None: none given, or JSON text)."""
    src = args.speculative_config
    return src if src is not None and not src.lstrip().startswith("{") else None


def _spec_value(args) -> tuple[Any, str | None]:
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


def _spec_json(args) -> dict | None:
    """The speculative config's JSON object as given (None: none given, or not a readable JSON
    object; `_spec_of_flags` then says why)."""
    value = _spec_value(args)[0]
    return value if isinstance(value, dict) else None


def _check_outputs(cmd: str, args, outputs, inputs=(), keep=()) -> None:
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
    head = (_spec_json(args) or {}).get("model")
    common = [("--speculative-config", _spec_file(args)),
              ("--speculative-config's model", head if isinstance(head, str) and head != "builtin" else None)]
    loading.check_outputs(outputs, list(inputs) + common + loading.model_inputs(args), overwrite=args.overwrite,
                          dirs=[("--compilation-cache-dir", cache)], keep=keep)


def _check_backend(cmd: str, args) -> None:
    """--backend pallas on a CPU host, before any model is loaded (the kernel's own error
    advises arguments the CLI has no flags for)."""
    import jax
    if args.backend == "pallas" and jax.default_backend() == "cpu":
        _fail(cmd, "--backend", "the Pallas kernels compile for a GPU or TPU and this host runs on CPU: pass "
              "--backend interpret (the Pallas kernels interpreted, slow) or --backend xla")


def _needs_draft(spec) -> bool:
    from dsd_jax import drafters
    return drafters.get(spec.method).needs_model


def _needs_draft_flag(spec) -> bool:
    """Whether --draft must be given: the method needs a model and cannot load the one its
    spec names itself (an EAGLE-3 head is loaded from `model`, the built-in by default)."""
    from dsd_jax import drafters
    return _needs_draft(spec) and not hasattr(drafters.get(spec.method), "load_model")


def _engine_draft(args, spec, draft, target):
    """The engine's `draft=`: for method "eagle3" the head the spec names (the built-in one by
    default, in the target's dtype), loaded here unless `draft` is it already; else the draft
    model."""
    from dsd_jax.models.eagle3 import Eagle3Config
    if spec.method != "eagle3" or isinstance(getattr(draft, "config", None), Eagle3Config):
        return draft
    custom = args.target or args.hf_target or getattr(args, "synthetic", None)
    return loading.draft_for(spec, draft, "custom" if custom else "builtin", "--speculative-config",
                             target.config.dtype)


def _make_engine(cmd: str, args, target, draft, tokenizer, spec, profile=None):
    from dsd_jax import SpecEngine
    from dsd_jax.sharding import make_mesh
    draft = _engine_draft(args, spec, draft, target)
    try:
        mesh = None if args.mesh is None else make_mesh(*args.mesh)
    except ValueError as e:
        _fail(cmd, "--mesh", str(e))
    vocab = target.config.vocab_size
    for flag in ("top_logprobs", "prompt_logprobs"):  # named here, not as the engine's max_logprobs
        asked = getattr(args, flag, None) or 0
        if asked > vocab:
            _fail(cmd, "--" + flag.replace("_", "-"), f"at most the vocabulary's {vocab} ids, got {asked}")
    try:
        return SpecEngine(target, draft if _needs_draft(spec) else None, spec,
                          max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
                          tokenizer=tokenizer, prefill_chunk=args.prefill_chunk, profile=profile,
                          backend=args.backend, compilation_cache_dir=args.compilation_cache_dir,
                          seed=args.seed or 0, mesh=mesh,
                          max_logprobs=max(getattr(args, "top_logprobs", None) or 0,
                                           getattr(args, "prompt_logprobs", None) or 0),
                          share_prefixes=getattr(args, "share_prefixes", True))
    except (ValueError, NotImplementedError) as e:
        _fail(cmd, None, f"cannot build the engine: {e}")


def _progress_bar(args, total: int, desc: str, unit: str):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=True if args.no_progress else None)


# --------------------------------------------------------------------------- profile

def _context_lengths(cmd: str, args) -> list[int]:
    if args.context_lengths is None:
        return [c for c in (128, 512) if c <= args.max_seq_len] or [max(1, args.max_seq_len // 2)]
    ctx = sorted(set(args.context_lengths))
    bad = [c for c in ctx if not 1 <= c <= args.max_seq_len]
    if bad:
        _fail(cmd, "--context-lengths", f"{bad} outside 1..--max-seq-len ({args.max_seq_len})")
    return ctx


NUM_PROMPTS, ACCEPTANCE_MAX_TOKENS = 16, 64  # profile's defaults


def _unused_acceptance_flags(cmd: str, args, why: str) -> None:
    """Refuses the flags of the acceptance runs where none runs (`why`): ignored, they would
    leave the user thinking they shaped the profile."""
    for flag, value in (("--prompts", args.prompts), ("--num-prompts", args.num_prompts),
                        ("--acceptance-max-tokens", args.acceptance_max_tokens)):
        if value is not None:
            _fail(cmd, flag, f"{why}: no acceptance run uses it")
    if len(args.temperatures) > 1:
        _fail(cmd, "--temperatures", f"{why}: give one temperature, the one the steps are timed at (the "
              "others would each name an acceptance run)")


def _random_prompts_note() -> None:
    print("dsd-jax profile: note: no --prompts given; acceptance is measured on random token prompts, "
          "meaningful only for random models: for trained checkpoints pass --prompts FILE (prompts like "
          "your workload's) or --acceptance a1,a2,...", file=sys.stderr)


def _acceptance_prompts(cmd: str, args, tokenizer, source: str, vocab: int) -> list[list[int]] | None:
    """--prompts (their ids in the target's vocabulary, checked before the timing), else the
    built-in held-out prompts for the built-in pair, else None (random)."""
    if args.prompts:
        if args.num_prompts is not None:
            _fail(cmd, "--num-prompts", "counts the built-in held-out prompts; with --prompts every prompt "
                  "of the file is used")
        raw, where = loading.read_prompts("--prompts", args.prompts, args.prompt_format, with_lines=True)
        return loading.encode_prompts(raw, tokenizer, vocab, flag="--prompts", names=where)
    if source != "builtin":
        if args.num_prompts is not None:
            _fail(cmd, "--num-prompts", "counts the built-in held-out prompts, used only with the built-in "
                  "models; pass --prompts FILE")
        return None
    try:
        from dsd_jax.models import heldout_prompts
        texts = heldout_prompts(args.num_prompts or NUM_PROMPTS)
    except (ImportError, OSError, ValueError) as e:
        _fail(cmd, "--prompts", f"the built-in held-out prompts are not available ({e}); pass --prompts FILE")
    return loading.encode_prompts(texts, tokenizer, flag="--prompts")


def _synthetic_models(cmd: str, args):
    """--synthetic / --draft-synthetic: real shapes, random weights (`models.synthetic`)."""
    from dsd_jax.models.synthetic import SYNTHETIC_CONFIGS, synthetic
    if args.target or args.hf_target or args.draft or args.hf_draft:
        _fail(cmd, "--synthetic", "give synthetic models or checkpoints (--target/--hf-target), not both")
    for flag, name in (("--synthetic", args.synthetic), ("--draft-synthetic", args.draft_synthetic)):
        if name is not None and name.lower() not in SYNTHETIC_CONFIGS:
            _fail(cmd, flag, f"unknown model {name!r}; known: {', '.join(SYNTHETIC_CONFIGS)}")
    if args.synthetic is None:
        _fail(cmd, "--draft-synthetic", "needs --synthetic TARGET")
    # one tokenizer per family (Qwen2.5 and Qwen3 share one; its vocabularies are padded to
    # 151936 or 152064 rows, which the draft-model drafter bridges)
    family = {n: SYNTHETIC_CONFIGS[n.lower()]["model_type"].rstrip("0123456789")
              for n in (args.synthetic, args.draft_synthetic) if n}
    if args.draft_synthetic and family[args.draft_synthetic] != family[args.synthetic]:
        _fail(cmd, "--draft-synthetic", f"{args.draft_synthetic} is a {family[args.draft_synthetic]} "
              f"model with another tokenizer than {args.synthetic}'s; pick a draft of the same family")
    dtype = args.dtype = "bfloat16" if args.dtype in (None, "auto") else args.dtype
    tokenizer = loading.load_tokenizer_flag(args.tokenizer) if args.tokenizer else None  # for text --prompts
    target = synthetic(args.synthetic, dtype=dtype, seed=0)
    draft = None if args.draft_synthetic is None else synthetic(args.draft_synthetic, dtype=dtype, seed=1)
    return target, draft, tokenizer, "synthetic"


def cmd_profile(args) -> int:
    cmd = "profile"
    outputs = [("--out", args.out)]
    _check_outputs(cmd, args, outputs, [("--prompts", None if args.prompts == "-" else args.prompts)])
    _check_backend(cmd, args)
    if args.acceptance is not None:
        _unused_acceptance_flags(cmd, args, "--acceptance gives the acceptance")
    if args.prompts and args.prompts != "-":  # "-": stdin, as generate reads it
        loading.existing_file("--prompts", args.prompts)
    if args.prompt_format != "auto" and not args.prompts:  # ignored, it would mislead
        _fail(cmd, "--prompt-format", "says how to read --prompts, and no --prompts is given")
    spec = _load_spec(cmd, args)
    if (args.target or args.hf_target) and args.acceptance is None and not args.prompts and spec.max_k > 0:
        _random_prompts_note()  # before minutes of loading, where Ctrl-C still costs nothing
    if args.synthetic or args.draft_synthetic:
        target, draft, tokenizer, source = _synthetic_models(cmd, args)
    else:
        target, draft, tokenizer, source = loading.load_models(args)
    if spec.dynamic is not None:
        spec = spec.replace(dynamic=None)  # profiling runs fixed Ks; no profile needed yet
    ctx = _context_lengths(cmd, args)
    if spec.max_k == 0:
        if args.acceptance is not None:
            _fail(cmd, "--acceptance", "the speculative config speculates no tokens (K = 0): there is no "
                  "acceptance to record")
        _unused_acceptance_flags(cmd, args, "the speculative config speculates no tokens (K = 0)")
    if args.acceptance is not None:
        if any(not 0.0 <= a <= 1.0 for a in args.acceptance):
            _fail(cmd, "--acceptance", f"values must be probabilities in [0, 1], got {args.acceptance}")
        if len(args.acceptance) < spec.max_k:
            _fail(cmd, "--acceptance", f"give a_1..a_K for every K up to {spec.max_k} "
                  f"(num_speculative_tokens), got {len(args.acceptance)} values")
        from dsd_jax.profile import check_nonincreasing
        try:
            check_nonincreasing("values", args.acceptance)
        except ValueError as e:
            _fail(cmd, "--acceptance", str(e))
        if len(args.acceptance) > spec.max_k:  # a published curve may run past this K
            print(f"dsd-jax profile: note: K = {spec.max_k}: recording a_1..a_{spec.max_k} = "
                  f"{args.acceptance[:spec.max_k]}; the other {len(args.acceptance) - spec.max_k} "
                  f"value(s) are past K", file=sys.stderr)
        prompts = None
    else:
        if source == "synthetic" and spec.max_k > 0:
            print("dsd-jax profile: note: random weights accept nothing meaningful; pass --acceptance "
                  "a1,a2,... (e.g. a published per-position curve)", file=sys.stderr)
        prompts = (_acceptance_prompts(cmd, args, tokenizer, source, target.config.vocab_size)
                   if spec.max_k > 0 else None)

    engine = _make_engine(cmd, args, target, draft, tokenizer, spec)
    from dsd_jax.profiler import format_profile, profile_engine
    n_cells = len(ctx) * len(engine.batch_buckets) * (engine.max_k + 1)
    total = n_cells + (len(args.temperatures) if engine.max_k > 0 and args.acceptance is None else 0)
    bar = _progress_bar(args, total, "profile (B, K, context) cells", "cell")

    def progress(done, total_):
        bar.update(done - bar.n)
        if done == n_cells and total_ > n_cells:
            bar.set_description("profile acceptance runs")

    from dsd_jax.device_check import precompile_steps
    # the (K, B) step programs, compiled side by side (XLA compiles release the GIL)
    precompile_steps(engine, range(engine.max_k + 1), engine.batch_buckets)
    try:
        if args.acceptance is not None:  # latency measured here, acceptance as given
            from dsd_jax.device_check import profile_with_acceptance
            prof = profile_with_acceptance(engine, args.acceptance, context_lengths=ctx,
                                           repeats=args.repeats, warmup_reps=args.warmup_reps,
                                           passes=args.passes, progress=progress, seed=args.seed or 0,
                                           latency_temperature=args.temperatures[0])
        else:
            prof = profile_engine(engine, context_lengths=ctx, repeats=args.repeats,
                                  warmup_reps=args.warmup_reps, passes=args.passes, prompts=prompts,
                                  acceptance_max_tokens=args.acceptance_max_tokens or ACCEPTANCE_MAX_TOKENS,
                                  temperatures=args.temperatures, progress=progress,
                                  latency_temperature=args.temperatures[0], seed=args.seed or 0)
    except ValueError as e:
        _fail(cmd, None, str(e))
    finally:
        bar.close()
    prof.meta["model_source"] = source
    if source == "synthetic":
        prof.meta["synthetic"] = {"target": args.synthetic, "draft": args.draft_synthetic,
                                  "dtype": target.config.dtype}
    with loading.writing("--out", args.out):
        prof.save(args.out)
    print(format_profile(prof))
    secs = prof.meta.get("profiler_seconds", {})
    print(f"wrote {args.out} (latency {secs.get('latency')} s, acceptance {secs.get('acceptance')} s)",
          file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- generate

def _sampling(cmd: str, args, tokenizer, n: int, vocab_size: int) -> list:
    """One SamplingParams per prompt (request i seeded seed + i), stopping at the tokenizer's
    end-of-text tokens and an --hf-target's own eos_token_ids unless --ignore-eos."""
    from dsd_jax import SamplingParams
    from dsd_jax.state import MAX_STOP_IDS
    raw = list(args.stop_token_ids or [])
    stop = list(dict.fromkeys(raw))  # a repeat counts once, as in SamplingParams
    given = len(stop)
    if not args.ignore_eos:
        stop += [t for t in loading.eos_token_ids(tokenizer, args.hf_target, vocab_size) if t not in stop]
    if len(stop) > MAX_STOP_IDS:  # the engine's error would not say where the other ids came from
        added = len(stop) - given
        eos = (f" and {added} end-of-text id{'s' * (added != 1)} of the tokenizer added "
               "(--ignore-eos leaves those out)") if added else ""
        distinct = " distinct" if given < len(raw) else ""
        _fail(cmd, "--stop-token-ids", f"{len(stop)} stop ids: {given}{distinct} given{eos}; at most "
              f"{MAX_STOP_IDS} are supported")
    try:
        # ignore_eos: `stop` already holds the end-of-text ids (the checkpoint's too) unless
        # --ignore-eos, and the records' settings name it whole
        return [SamplingParams(**_sampling_flags(args), stop_token_ids=stop, ignore_eos=True,
                               seed=None if args.seed is None else args.seed + i) for i in range(n)]
    except ValueError as e:
        _fail(cmd, None, f"invalid sampling flags: {e}")


def _check_sampling_flags(cmd: str, args) -> None:
    """The sampling flags `SamplingParams` checks without the tokenizer's stop ids or the
    vocabulary, before any model loads (`_sampling` builds the real ones after)."""
    from dsd_jax import SamplingParams
    try:
        SamplingParams(**_sampling_flags(args), stop_token_ids=list(args.stop_token_ids or []))
    except ValueError as e:
        _fail(cmd, None, f"invalid sampling flags: {e}")


# generate's flags that are `SamplingParams` fields of the same name
_SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p", "max_tokens", "min_tokens",
                   "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
                   "allowed_token_ids")


def _sampling_flags(args) -> dict:
    return {**{flag: getattr(args, flag) for flag in _SAMPLING_FLAGS}, "stop": args.stop or (),
            "bad_words": args.bad_words or (), "logprobs": args.top_logprobs,
            "prompt_logprobs": args.prompt_logprobs}


def _generate_records(args, engine, raw_prompts, prompts, sampling, settings=None, first: int = 0) -> None:
    """Generates prompts[first:] (the earlier ones' records kept by a resumed run), writing
    the records as they finish: to stdout, to a device or FIFO --out directly, else to --out
    + `records.PARTIAL` (after the run's `settings` beside it, unless resumed), renamed to --out once
    every record is there (a run that fails or is killed leaves the earlier --out whole and
    the finished records in the partial file, never a half-written --out; `records`)."""
    todo, todo_sampling = prompts[first:], sampling[first:] if sampling is not None else None
    if not args.out:
        _run_generate(args, engine, todo, todo_sampling,
                      records.InOrder(args.logprobs, raw_prompts, prompts, _stdout_lines()))
        return
    partial = records.partial_path(args.out)
    if partial and first == 0:
        records.write_settings(args.out, settings or {})
    with loading.writing("--out", args.out):  # /dev/stdout, a FIFO: appended to in place
        f = open(partial or args.out, "w" if partial and first == 0 else "a", encoding="utf-8")
    write = records.InOrder(args.logprobs, raw_prompts, prompts, f, args.out, first)
    try:
        with f:
            if todo:
                _run_generate(args, engine, todo, todo_sampling, write)
    except BaseException:
        if partial and write.next == 0:
            records.discard(args.out)  # nothing finished: nothing to keep
        elif partial:
            print(f"dsd-jax generate: the run stopped; its first {write.next} records are in {partial} "
                  "(--resume continues it)", file=sys.stderr)
        raise
    if partial:
        records.finish(args.out)


class _Utf8Lines:
    """Text written to a binary stream as UTF-8, whatever the locale's encoding."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> None:
        self.raw.write(text.encode("utf-8"))

    def flush(self) -> None:
        self.raw.flush()


def _stdout_lines():
    """Stdout for records, in UTF-8 whatever the locale (records hold any text: ensure_ascii
    is off), through sys.stdout.buffer; a stdout without one (a test's capture) takes text."""
    raw = getattr(sys.stdout, "buffer", None)
    sys.stdout.flush()  # whatever the text layer holds goes first
    return sys.stdout if raw is None else _Utf8Lines(raw)


def _write_file(flag: str, path: str, write) -> None:
    with loading.writing(flag, path):
        loading.atomic_write(path, write)


def _run_generate(args, engine, prompts, sampling, on_output):
    if args.warmup:
        bar = _progress_bar(args, None, "compile", "program")
        engine.warmup(lambda done, total: (setattr(bar, "total", total), bar.update(done - bar.n)))
        bar.close()
    bar = _progress_bar(args, len(prompts), "generate", "req")
    try:
        return engine.generate(prompts, sampling, return_logprobs=args.logprobs,
                               progress=lambda n: bar.update(n - bar.n), on_output=on_output)
    except ValueError as e:
        _fail("generate", None, str(e))
    finally:
        bar.close()


def _resume_keeps(cmd: str, args, partial: str | None) -> list[str]:
    """--resume checked against the other flags: the outputs a resumed run continues (its
    partial file, its settings, and --out itself when the run being resumed was to replace
    it), or [] without --resume."""
    if not args.resume:
        return []
    if not args.out:
        _fail(cmd, "--resume", "continues an interrupted --out FILE run; give its --out")
    if partial is None:
        _fail(cmd, "--resume", f"--out {args.out!r} is written in place (a device or FIFO), so no run of it "
              "can be resumed")
    if not os.path.exists(partial) and os.path.exists(args.out):
        _fail(cmd, "--resume", f"{args.out!r} exists and no run of it is unfinished ({partial!r} is not "
              "there): nothing to resume; to generate it again, pass --overwrite without --resume")
    return [partial, records.settings_path(args.out)] + ([args.out] if os.path.exists(partial) else [])


# flags whose values decide a generate run's records: a resumed run must have them all alike
_RECORD_FLAGS = _SAMPLING_FLAGS + ("seed", "logprobs", "top_logprobs", "prompt_logprobs", "max_seq_len",
                                   "dtype", "method", "prompt_format", "stop", "bad_words", "share_prefixes")
# flags added after runs' settings files were first written, with the value a file that
# lacks one was generated with (off; prefix sharing: on, its default): such a run resumes
# under that value
_RECORD_FLAGS_ADDED = {"min_p": 0.0, "min_tokens": 0, "repetition_penalty": 1.0,
                       "presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": None,
                       "bad_words": None, "allowed_token_ids": None, "top_logprobs": None,
                       "prompt_logprobs": None, "share_prefixes": True}
_MODEL_FLAGS = ("target", "draft", "hf_target", "hf_draft", "tokenizer")


def _run_settings(args, sampling=None) -> dict:
    """What a generate run's records depend on, as JSON: the flags of `_RECORD_FLAGS`, the
    models' paths (resolved), the speculative config given and, with `sampling`, the stop ids
    (the tokenizer's included)."""
    out = {flag: getattr(args, flag) for flag in _RECORD_FLAGS}
    out.update({flag: None if getattr(args, flag) is None else os.path.realpath(getattr(args, flag))
                for flag in _MODEL_FLAGS})
    out["speculative_config"] = _spec_value(args)[0]
    if sampling is not None:
        out["stop_token_ids"] = list(sampling[0].stop_token_ids) if sampling else None
    return json.loads(json.dumps(out))  # as the settings file will read back (tuples as lists)


def cmd_generate(args) -> int:
    cmd = "generate"
    from dsd_jax import DynamicConfig
    from dsd_jax.profile import Profile
    partial = records.partial_path(args.out)
    outputs = [("--out", args.out), ("--out the records of an unfinished run: --resume continues it", partial),
               ("--out", records.settings_path(args.out)),  # (written as it goes)
               ("--stats", args.stats), ("--trace", args.trace)]
    keep = _resume_keeps(cmd, args, partial)
    if args.resume:  # the flags now, before minutes of loading; the stop ids once the tokenizer is in
        records.check_settings(args.out, _run_settings(args), _RECORD_FLAGS_ADDED)
    dyn = (_spec_json(args) or {}).get("dynamic")
    dyn_profile = dyn.get("profile") if isinstance(dyn, dict) else None
    _check_outputs(cmd, args, outputs, [("--prompts", None if args.prompts == "-" else args.prompts),
                                        ("--profile", args.profile),
                                        ("--speculative-config's dynamic.profile",
                                         dyn_profile if isinstance(dyn_profile, str) else None)], keep)
    _check_backend(cmd, args)
    if args.profile:
        loading.existing_file("--profile", args.profile)
        if isinstance(dyn_profile, str) and os.path.realpath(dyn_profile) != os.path.realpath(args.profile):
            _fail(cmd, "--profile", f"{args.profile!r} is not the speculative config's dynamic.profile "
                  f"{dyn_profile!r}; give one of them")
    raw_prompts, where = loading.read_prompts("--prompts", args.prompts, args.prompt_format, with_lines=True)
    if args.seed is not None and args.seed + len(raw_prompts) - 1 >= SEED_LIMIT:
        _fail(cmd, "--seed", f"request i is seeded --seed + i, and {args.seed} + {len(raw_prompts) - 1} "
              f"(the last of {len(raw_prompts)} prompts) is past 2**32 - 1; give a smaller --seed")
    spec = _load_spec(cmd, args)
    _check_sampling_flags(cmd, args)
    # the profile and the sampling flags first: their errors come before minutes of loading
    profile = None
    profile_path = args.profile or (spec.dynamic.profile if spec.dynamic is not None else None)
    flag = "--profile" if args.profile else "--speculative-config"
    if profile_path and not args.profile:
        loading.existing_file(flag, profile_path)  # dynamic.profile in the speculative config
    if profile_path:
        if spec.method == "none":
            _fail(cmd, flag, "a profile drives the goodput controller; it needs a speculative method "
                  "(the speculative config says method 'none')")
        if spec.num_speculative_tokens_per_batch_size is not None:
            _fail(cmd, flag, "the speculative config has a per-batch-size schedule; a profile "
                  "(goodput controller) and a schedule are mutually exclusive")
        try:
            profile = Profile.load(profile_path)
        except ValueError as e:
            _fail(cmd, flag, str(e))
        # the engine warns where the profile was measured for other models, device or mesh,
        # and where it does not fit the engine (batch, K, max_seq_len)
        dyn = spec.dynamic or DynamicConfig()
        spec = spec.replace(dynamic=DynamicConfig(**{**dyn.to_dict(), "profile": profile_path}))

    target, draft, tokenizer, _ = loading.load_models(args)
    for flag, given, why in (("--stop", args.stop, "stop strings are matched in the decoded text"),
                             ("--bad-word", args.bad_words, "bad words are tokenized")):
        if given and tokenizer is None:
            _fail(cmd, flag, f"{why}: they need a tokenizer (--tokenizer FILE, or an --hf-target "
                  "directory holding tokenizer.json)")
    draft = _engine_draft(args, spec, draft, target)
    prompts = loading.encode_prompts(raw_prompts, tokenizer, target.config.vocab_size, "--prompts", where)
    for ids, name in zip(prompts, where):  # the engine would name the prompt by its index only
        if len(ids) >= args.max_seq_len:
            _fail(cmd, "--prompts", f"{name} has {len(ids)} tokens; --max-seq-len {args.max_seq_len} leaves "
                  "no room to generate (raise --max-seq-len or shorten the prompt)")

    sampling = _sampling(cmd, args, tokenizer, len(prompts), target.config.vocab_size)
    settings = _run_settings(args, sampling)
    first = (records.resumable(args.out, settings, prompts, _RECORD_FLAGS_ADDED,
                               [p.get("prompt") for p in raw_prompts]) if args.resume else 0)
    if first == len(prompts):  # every record was kept: nothing to generate, no engine
        _generate_records(args, None, raw_prompts, prompts, sampling, settings, first)
        if args.stats or args.trace:
            print("dsd-jax generate: every record was already generated; no --stats or --trace written",
                  file=sys.stderr)
        return 0
    engine = _make_engine(cmd, args, target, draft, tokenizer, spec, profile=profile)
    _generate_records(args, engine, raw_prompts, prompts, sampling, settings, first)
    if args.stats:
        text = json.dumps(engine.metrics(), indent=1, default=float) + "\n"
        _write_file("--stats", args.stats, lambda f: f.write(text))
    if args.trace:
        with loading.writing("--trace", args.trace):
            engine.stats.save_trace(args.trace)  # atomically
    return 0


# --------------------------------------------------------------------------- bench / demo

def _lazy_bench(cmd: str):
    try:
        from dsd_jax import bench
    except ModuleNotFoundError as e:
        if e.name in ("dsd_jax.bench",):
            _fail(cmd, None, "dsd_jax.bench is not part of this installation")
        raise
    return bench


def cmd_bench(args) -> int:
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:  # "" too: it would write nothing
            loading.output_file(flag, path)
    for flag, path in (("--profile", args.profile), ("--eagle3-profile", args.eagle3_profile)):
        if path:
            loading.existing_file(flag, path)
    if args.eagle3 and args.eagle3 != "builtin":
        loading.existing_dir("--eagle3", args.eagle3)
    if args.compilation_cache_dir:
        loading.output_dir("--compilation-cache-dir", args.compilation_cache_dir)
    return _lazy_bench("bench").main(args) or 0


def cmd_demo(args) -> int:
    loading.output_dir("--out-dir", args.out_dir)
    args.full = not args.quick
    return _lazy_bench("demo").demo(args) or 0


# --------------------------------------------------------------------------- parser

def _add_overwrite_flag(p: argparse.ArgumentParser, outputs: str) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help=f"replace an existing file named by {outputs} (default: refuse, so that an "
                        "earlier result is not lost)")


def _add_profile(sub) -> None:
    p = sub.add_parser("profile", help="measure step latency per (batch, K, context) and draft acceptance",
                       description="Profile the engine in process and write a profile JSON for the "
                                   "goodput controller (SpecConfig dynamic.profile / generate --profile).")
    _add_model_flags(p)
    _add_engine_flags(p, max_batch=16, max_seq=1024)
    p.add_argument("--context-lengths", type=_int_list, metavar="N,N,...",
                   help="context lengths to time (default 128,512, those <= --max-seq-len)")
    p.add_argument("--repeats", type=positive_int, default=7,
                   help="timed calls per cell and pass (median; default 7)")
    p.add_argument("--warmup-reps", type=nonneg_int, default=2, help="untimed calls per cell and pass (default 2)")
    p.add_argument("--passes", type=positive_int, default=2,
                   help="times the whole latency table over, samples pooled (default 2)")
    p.add_argument("--prompts", metavar="FILE",
                   help="acceptance prompts (same format as generate; default: the built-in held-out prompts "
                        "with the built-in models, else random token prompts)")
    _add_prompt_format_flag(p)
    p.add_argument("--num-prompts", type=positive_int,
                   help=f"built-in held-out prompts to use (default {NUM_PROMPTS})")
    p.add_argument("--acceptance-max-tokens", type=positive_int,
                   help=f"tokens generated per prompt in the acceptance runs (default {ACCEPTANCE_MAX_TOKENS})")
    p.add_argument("--temperatures", type=_nonneg_float_list, default=[0.0], metavar="T,T,...",
                   help="acceptance run temperatures (the controller starts each generate call from the "
                        "one closest to its requests' median temperature); the first is the profile's default, and the "
                        "step times are taken sampling at it (a sampled step also draws noise; default 0); "
                        "with --acceptance one value: the temperature the steps are timed at")
    p.add_argument("--synthetic", metavar="NAME", help="target: a real config with random weights "
                   "(dsd_jax.models.synthetic, e.g. llama-3.1-8b, qwen3-8b); default dtype bfloat16")
    p.add_argument("--draft-synthetic", metavar="NAME", help="draft: likewise (e.g. llama-3.2-1b, qwen3-0.6b)")
    p.add_argument("--acceptance", type=_float_list, metavar="A1,A2,...",
                   help="per-position acceptance a_i = P(accepted >= i) to record instead of measuring "
                        "it (e.g. a published curve; needed with random weights); at least K values, "
                        "K = num_speculative_tokens (those past K are noted and not recorded); the "
                        "acceptance-run flags (--prompts, ...) do not apply")
    p.add_argument("--out", default="profile.json", metavar="FILE.json", help="output (default profile.json)")
    _add_overwrite_flag(p, "--out")
    p.set_defaults(func=cmd_profile)


def _add_prompt_format_flag(p) -> None:
    p.add_argument("--prompt-format", choices=loading.PROMPT_FORMATS, default="auto",
                   help="how to read --prompts: text (a prompt per line), jsonl, or auto (default: "
                        "JSONL when the first line starts with '{' or the file is *.jsonl)")


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="generate completions for prompts (JSONL out)",
                       description="Generate for each prompt; one JSON object per line out.")
    _add_model_flags(g)
    _add_engine_flags(g, max_batch=16, max_seq=1024)
    g.add_argument("--prompts", metavar="FILE",
                   help="one prompt per line, or JSONL with {\"prompt\": ...} / {\"prompt_token_ids\": [...]}; "
                        "default or '-': stdin")
    _add_prompt_format_flag(g)
    g.add_argument("--out", metavar="FILE", help="JSONL output (default stdout), one record per prompt in "
                   "prompt order, written as they finish to FILE.partial and renamed to FILE at the end: "
                   "an interrupted run leaves FILE as it was and its finished records in FILE.partial "
                   "(--resume continues it)")
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    g.add_argument("--top-k", type=nonneg_int, default=0, help="0 = off (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="(0, 1]; 1 = off (default)")
    g.add_argument("--min-p", type=float, default=0.0,
                   help="[0, 1]: keep tokens at least this fraction as likely as the likeliest; 0 = off "
                        "(default)")
    g.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per request (default 64)")
    g.add_argument("--min-tokens", type=nonneg_int, default=0,
                   help="tokens each completion has before a stop id, end-of-text token or stop string "
                        "can end it (default 0; at most --max-tokens)")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0: a token of the prompt or the completion has its logit divided by this "
                        "(multiplied, if negative); 1 = off (default)")
    g.add_argument("--presence-penalty", type=float, default=0.0,
                   help="[-2, 2]: subtracted once from the logit of a token in the completion; 0 = off "
                        "(default)")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="[-2, 2]: subtracted from a token's logit per time it is in the completion; "
                        "0 = off (default)")
    g.add_argument("--logit-bias", type=_logit_bias, metavar="ID=BIAS,...",
                   help="biases in [-100, 100] added to those tokens' logits before the penalties "
                        "(-100 all but bans a token)")
    g.add_argument("--allowed-token-ids", type=_int_list, metavar="ID,ID,...",
                   help="the only token ids the completions may hold (vLLM's allowed_token_ids)")
    g.add_argument("--stop-token-ids", type=_int_list, metavar="ID,ID,...", help="stop token ids")
    g.add_argument("--stop", action="append", metavar="STR",
                   help="a stop string (repeat the flag for more): the completion ends with the token "
                        "that completes it; its text ends before it, and its record's stop_reason names it")
    g.add_argument("--bad-word", action="append", dest="bad_words", metavar="WORD",
                   help="a word the completion may not contain (repeat the flag for more; vLLM's "
                        "bad_words): its last token is banned where the rest of it was just generated")
    g.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at the tokenizer's end-of-text tokens, nor (with --hf-target) at the "
                        "checkpoint's own eos_token_id")
    g.add_argument("--logprobs", action="store_true", help="write per-token logprobs")
    g.add_argument("--top-logprobs", type=int, metavar="N",
                   help="write each token's N likeliest tokens with their raw logprobs, and its own "
                        "(vLLM's logprobs=N): top_logprobs, per token a list of [id, logprob] pairs")
    g.add_argument("--prompt-logprobs", type=int, metavar="N",
                   help="write the same for each prompt token (vLLM's prompt_logprobs=N): prompt_logprobs, "
                        "null for the first token")
    g.add_argument("--no-share-prefixes", dest="share_prefixes", action="store_false",
                   help="prefill every prompt whole: by default a prompt beginning with 32 or more tokens "
                        "of another one's (a shared system prompt) copies them from that request's slot, "
                        "which gives the same tokens up to floating-point rounding")
    g.add_argument("--profile", metavar="FILE", help="profile JSON: use the goodput controller")
    g.add_argument("--warmup", action="store_true", help="compile every program before generating")
    g.add_argument("--stats", metavar="FILE", help="write engine.metrics() as JSON")
    g.add_argument("--trace", metavar="FILE", help="write the per-step trace as JSON")
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted --out FILE run: keep the records in FILE.partial (each "
                        "checked against its prompt, the flags against those the run started with) and "
                        "generate the prompts after them (request i is seeded --seed + i either way); "
                        "with --overwrite, an existing --stats or --trace file is replaced")
    _add_overwrite_flag(g, "--out, --stats or --trace")
    g.set_defaults(func=cmd_generate)


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="benchmark vanilla / static-K / dynamic decoding",
                       description="Benchmark configurations over batch sizes: the draft model's "
                                   "(static-K, dynamic) and the EAGLE-3 head's (eagle3-static-K, "
                                   "eagle3-dynamic), in one process.")
    _add_model_flags(b)
    b.add_argument("--method", choices=("draft_model", "eagle3", "both"),
                   help="whose default configurations to run (not with --configs, which names "
                        "them): the draft model's (default), the EAGLE-3 head's (eagle3-...) or both")
    b.add_argument("--eagle3", metavar="DIR", help="EAGLE-3 head directory for the eagle3-... "
                   "configurations (default: the built-in head, with the built-in models)")
    b.add_argument("--eagle3-profile", metavar="FILE",
                   help="profile JSON of the EAGLE-3 engine for eagle3-dynamic (default: profile now)")
    b.add_argument("--quick", action="store_true", help="a small, fast run")
    b.add_argument("--json", metavar="FILE", help="write results as JSON")
    b.add_argument("--plot", metavar="FILE.png", help="write a plot")
    b.add_argument("--profile", metavar="FILE", help="profile JSON for the (draft-model) dynamic configuration")
    b.add_argument("--batch-sizes", type=_int_list, metavar="1,2,4,...", help="batch sizes")
    b.add_argument("--configs", type=_str_list, metavar="vanilla,static-1,...,dynamic,eagle3-static-2,...",
                   help="configurations to run (eagle3-...: the EAGLE-3 head)")
    b.add_argument("--eagle3-max-batch", type=positive_int, metavar="N",
                   help="run the eagle3 configurations only at batch sizes <= N")
    b.add_argument("--repeats", type=positive_int, help="repeats per point")
    b.add_argument("--rows-per-point", type=positive_int, metavar="N",
                   help="prompts per batch-size point, run as ceil(N/B) groups of B (default 8; --quick 4); "
                        "at 3 repeats or more each repeat takes groups of its own where the 615 held-out "
                        "prompts hold them (to B=64 at 6 repeats). The intervals resample the groups, so a "
                        "point of one group repeated has none; resolving 5%% at B=1 needs about 16 groups, "
                        "by the spread of the committed benches"),
    b.add_argument("--min-units", type=nonneg_int, metavar="N",
                   help="pair units a sweep point gets at least, adding prompt groups to each repeat "
                        "where the held-out prompts hold them (default 18: B=4-32 at 6 repeats; --quick 0); "
                        "needs --repeats 3 or more, where each repeat takes groups of its own")
    b.add_argument("--rollout-units", type=positive_int, metavar="N",
                   help="rollouts of 64 requests, each with its own prompts and lengths (default 6; --quick 1): "
                        "the rollout's interval resamples them, so 1 gives none")
    b.add_argument("--max-tokens", type=positive_int, help="tokens per request of the batch-size sweep (the "
                   "rollout draws its own heavy-tailed lengths)")
    b.add_argument("--compilation-cache-dir", metavar="DIR",
                   help="persistent XLA compilation cache (makes the next run start fast)")
    b.add_argument("--mesh", type=_mesh_shape, metavar="DATAxMODEL",
                   help="run every engine on a device mesh, e.g. 2x2 (default: one device)")
    _add_overwrite_flag(b, "--json, --plot or the profile measured now (saved beside --json as "
                        "NAME.profile.json)")
    b.set_defaults(func=cmd_bench)


def _add_demo(sub) -> None:
    d = sub.add_parser("demo", help="profile + benchmark the built-in pair and EAGLE-3 head and write a report",
                       description="Run the end-to-end demo: the built-in draft model and EAGLE-3 head "
                                   "side by side against plain decoding.")
    d.add_argument("--out-dir", default="./dsd_jax_demo", metavar="DIR", help="default ./dsd_jax_demo")
    _add_overwrite_flag(d, "--out-dir (bench.json, bench.png, eagle3_profile.json, profile.json)")
    mode = d.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="quick", action="store_true", default=True,
                      help="small, fast run (default)")
    mode.add_argument("--full", dest="quick", action="store_false", help="the full run")
    d.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsd-jax", description="Dynamic speculative decoding for JAX/XLA.")
    sub = parser.add_subparsers(dest="command", metavar="{profile,generate,bench,demo}")
    for add in (_add_profile, _add_generate, _add_bench, _add_demo):
        add(sub)
    return parser


BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE (13): main's status when the reader of stdout left


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except loading.ArgumentError as e:  # a bad input found by the library, named by its flag
        _fail(args.command, e.flag, e.message)
    except MapLimitError as e:  # the programs would not fit this machine's memory-map limit
        _fail(args.command, None, str(e))
    except BrokenPipeError:
        # The reader of stdout left (`dsd-jax generate ... | head -1`): no traceback. Python's
        # recipe (docs: "Note on SIGPIPE"): point stdout at devnull, so that the flush at exit
        # does not fail again, and exit 141 = 128 + SIGPIPE, the status a shell reports for a
        # command that SIGPIPE ended (as `yes | head -1` leaves `yes`).
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (AttributeError, OSError, ValueError):  # a stdout without a descriptor (a test's capture)
            pass
        return BROKEN_PIPE_STATUS


if __name__ == "__main__":
    sys.exit(main())
