"""`dsd-jax profile`: times the engine's steps per (batch, K, context) and measures (or
records, with --acceptance) the drafter's acceptance, writing a profile JSON for the goodput
controller."""

from __future__ import annotations

import sys

from dsd_jax import loading
from dsd_jax.cli.common import check_backend, check_outputs, load_spec, make_engine, progress_bar
from dsd_jax.cli.flags import (add_engine_flags, add_model_flags, add_overwrite_flag, add_prompt_format_flag, error,
                               float_list, int_list, nonneg_float_list)
from dsd_jax.models.argtypes import nonneg_int, positive_int


def _context_lengths(cmd: str, args) -> list[int]:
    if args.context_lengths is None:
        return [c for c in (128, 512) if c <= args.max_seq_len] or [max(1, args.max_seq_len // 2)]
    ctx = sorted(set(args.context_lengths))
    bad = [c for c in ctx if not 1 <= c <= args.max_seq_len]
    if bad:
        error(cmd, "--context-lengths", f"{bad} outside 1..--max-seq-len ({args.max_seq_len})")
    return ctx


NUM_PROMPTS, ACCEPTANCE_MAX_TOKENS = 16, 64  # profile's defaults


def _unused_acceptance_flags(cmd: str, args, why: str) -> None:
    """Refuses the flags of the acceptance runs where none runs (`why`): ignored, they would
    leave the user thinking they shaped the profile."""
    for flag, value in (("--prompts", args.prompts), ("--num-prompts", args.num_prompts),
                        ("--acceptance-max-tokens", args.acceptance_max_tokens)):
        if value is not None:
            error(cmd, flag, f"{why}: no acceptance run uses it")
    if len(args.temperatures) > 1:
        error(cmd, "--temperatures", f"{why}: give one temperature, the one the steps are timed at (the "
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
            error(cmd, "--num-prompts", "counts the built-in held-out prompts; with --prompts every prompt "
                  "of the file is used")
        raw, where = loading.read_prompts("--prompts", args.prompts, args.prompt_format, with_lines=True)
        return loading.encode_prompts(raw, tokenizer, vocab, flag="--prompts", names=where)
    if source != "builtin":
        if args.num_prompts is not None:
            error(cmd, "--num-prompts", "counts the built-in held-out prompts, used only with the built-in "
                  "models; pass --prompts FILE")
        return None
    try:
        from dsd_jax.models import heldout_prompts
        texts = heldout_prompts(args.num_prompts or NUM_PROMPTS)
    except (ImportError, OSError, ValueError) as e:
        error(cmd, "--prompts", f"the built-in held-out prompts are not available ({e}); pass --prompts FILE")
    return loading.encode_prompts(texts, tokenizer, flag="--prompts")


def _synthetic_models(cmd: str, args):
    """--synthetic / --draft-synthetic: real shapes, random weights (`models.synthetic`)."""
    from dsd_jax.models.synthetic import SYNTHETIC_CONFIGS, synthetic
    if args.target or args.hf_target or args.draft or args.hf_draft:
        error(cmd, "--synthetic", "give synthetic models or checkpoints (--target/--hf-target), not both")
    for flag, name in (("--synthetic", args.synthetic), ("--draft-synthetic", args.draft_synthetic)):
        if name is not None and name.lower() not in SYNTHETIC_CONFIGS:
            error(cmd, flag, f"unknown model {name!r}; known: {', '.join(SYNTHETIC_CONFIGS)}")
    if args.synthetic is None:
        error(cmd, "--draft-synthetic", "needs --synthetic TARGET")
    # one tokenizer per family (Qwen2.5 and Qwen3 share one; its vocabularies are padded to
    # 151936 or 152064 rows, which the draft-model drafter bridges)
    family = {n: SYNTHETIC_CONFIGS[n.lower()]["model_type"].rstrip("0123456789")
              for n in (args.synthetic, args.draft_synthetic) if n}
    if args.draft_synthetic and family[args.draft_synthetic] != family[args.synthetic]:
        error(cmd, "--draft-synthetic", f"{args.draft_synthetic} is a {family[args.draft_synthetic]} "
              f"model with another tokenizer than {args.synthetic}'s; pick a draft of the same family")
    dtype = args.dtype = "bfloat16" if args.dtype in (None, "auto") else args.dtype
    tokenizer = loading.load_tokenizer_flag(args.tokenizer) if args.tokenizer else None  # for text --prompts
    target = synthetic(args.synthetic, dtype=dtype, seed=0)
    draft = None if args.draft_synthetic is None else synthetic(args.draft_synthetic, dtype=dtype, seed=1)
    return target, draft, tokenizer, "synthetic"


def cmd_profile(args) -> int:
    cmd = "profile"
    outputs = [("--out", args.out)]
    check_outputs(cmd, args, outputs, [("--prompts", None if args.prompts == "-" else args.prompts)])
    check_backend(cmd, args)
    if args.acceptance is not None:
        _unused_acceptance_flags(cmd, args, "--acceptance gives the acceptance")
    if args.prompts and args.prompts != "-":  # "-": stdin, as generate reads it
        loading.existing_file("--prompts", args.prompts)
    if args.prompt_format != "auto" and not args.prompts:  # ignored, it would mislead
        error(cmd, "--prompt-format", "says how to read --prompts, and no --prompts is given")
    spec = load_spec(cmd, args)
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
            error(cmd, "--acceptance", "the speculative config speculates no tokens (K = 0): there is no "
                  "acceptance to record")
        _unused_acceptance_flags(cmd, args, "the speculative config speculates no tokens (K = 0)")
    if args.acceptance is not None:
        if any(not 0.0 <= a <= 1.0 for a in args.acceptance):
            error(cmd, "--acceptance", f"values must be probabilities in [0, 1], got {args.acceptance}")
        if len(args.acceptance) < spec.max_k:
            error(cmd, "--acceptance", f"give a_1..a_K for every K up to {spec.max_k} "
                  f"(num_speculative_tokens), got {len(args.acceptance)} values")
        from dsd_jax.profile import check_nonincreasing
        try:
            check_nonincreasing("values", args.acceptance)
        except ValueError as e:
            error(cmd, "--acceptance", str(e))
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

    engine = make_engine(cmd, args, target, draft, tokenizer, spec)
    from dsd_jax.profiler import format_profile, profile_engine
    n_cells = len(ctx) * len(engine.batch_buckets) * (engine.max_k + 1)
    total = n_cells + (len(args.temperatures) if engine.max_k > 0 and args.acceptance is None else 0)
    bar = progress_bar(args, total, "profile (B, K, context) cells", "cell")

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
        error(cmd, None, str(e))
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


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="measure step latency per (batch, K, context) and draft acceptance",
                       description="Profile the engine in process and write a profile JSON for the "
                                   "goodput controller (SpecConfig dynamic.profile / generate --profile).")
    add_model_flags(p)
    add_engine_flags(p, max_batch=16, max_seq=1024)
    p.add_argument("--context-lengths", type=int_list, metavar="N,N,...",
                   help="context lengths to time (default 128,512, those <= --max-seq-len)")
    p.add_argument("--repeats", type=positive_int, default=7,
                   help="timed calls per cell and pass (median; default 7)")
    p.add_argument("--warmup-reps", type=nonneg_int, default=2, help="untimed calls per cell and pass (default 2)")
    p.add_argument("--passes", type=positive_int, default=2,
                   help="times the whole latency table over, samples pooled (default 2)")
    p.add_argument("--prompts", metavar="FILE",
                   help="acceptance prompts (same format as generate; default: the built-in held-out prompts "
                        "with the built-in models, else random token prompts)")
    add_prompt_format_flag(p)
    p.add_argument("--num-prompts", type=positive_int,
                   help=f"built-in held-out prompts to use (default {NUM_PROMPTS})")
    p.add_argument("--acceptance-max-tokens", type=positive_int,
                   help=f"tokens generated per prompt in the acceptance runs (default {ACCEPTANCE_MAX_TOKENS})")
    p.add_argument("--temperatures", type=nonneg_float_list, default=[0.0], metavar="T,T,...",
                   help="acceptance run temperatures (the controller starts each generate call from the "
                        "one closest to its requests' median temperature); the first is the profile's default, and the "
                        "step times are taken sampling at it (a sampled step also draws noise; default 0); "
                        "with --acceptance one value: the temperature the steps are timed at")
    p.add_argument("--synthetic", metavar="NAME", help="target: a real config with random weights "
                   "(dsd_jax.models.synthetic, e.g. llama-3.1-8b, qwen3-8b); default dtype bfloat16")
    p.add_argument("--draft-synthetic", metavar="NAME", help="draft: likewise (e.g. llama-3.2-1b, qwen3-0.6b)")
    p.add_argument("--acceptance", type=float_list, metavar="A1,A2,...",
                   help="per-position acceptance a_i = P(accepted >= i) to record instead of measuring "
                        "it (e.g. a published curve; needed with random weights); at least K values, "
                        "K = num_speculative_tokens (those past K are noted and not recorded); the "
                        "acceptance-run flags (--prompts, ...) do not apply")
    p.add_argument("--out", default="profile.json", metavar="FILE.json", help="output (default profile.json)")
    add_overwrite_flag(p, "--out")
    p.set_defaults(func=cmd_profile)
