"""`dsd-jax generate`: completions for a prompt file as JSONL records, written as they
finish (to --out's partial file, renamed at the end; --resume continues an interrupted run)."""

from __future__ import annotations

import json
import os
import sys

from dsd_jax import loading, records
from dsd_jax.cli.common import (check_backend, check_outputs, engine_draft, load_spec, make_engine, progress_bar,
                                spec_json, spec_value)
from dsd_jax.cli.flags import (SEED_LIMIT, add_engine_flags, add_model_flags, add_overwrite_flag,
                               add_prompt_format_flag, error, int_list, logit_bias)
from dsd_jax.models.argtypes import nonneg_int, positive_int


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
        error(cmd, "--stop-token-ids", f"{len(stop)} stop ids: {given}{distinct} given{eos}; at most "
              f"{MAX_STOP_IDS} are supported")
    try:
        # ignore_eos: `stop` already holds the end-of-text ids (the checkpoint's too) unless
        # --ignore-eos, and the records' settings name it whole
        return [SamplingParams(**_sampling_flags(args), stop_token_ids=stop, ignore_eos=True,
                               seed=None if args.seed is None else args.seed + i) for i in range(n)]
    except ValueError as e:
        error(cmd, None, f"invalid sampling flags: {e}")


def _check_sampling_flags(cmd: str, args) -> None:
    """The sampling flags `SamplingParams` checks without the tokenizer's stop ids or the
    vocabulary, before any model loads (`_sampling` builds the real ones after)."""
    from dsd_jax import SamplingParams
    try:
        SamplingParams(**_sampling_flags(args), stop_token_ids=list(args.stop_token_ids or []))
    except ValueError as e:
        error(cmd, None, f"invalid sampling flags: {e}")


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
        try:  # a refused request before the warm-up's minutes of compiling
            engine.check(prompts, sampling)
        except ValueError as e:
            error("generate", None, str(e))
        bar = progress_bar(args, None, "compile", "program")
        engine.warmup(lambda done, total: (setattr(bar, "total", total), bar.update(done - bar.n)))
        bar.close()
    bar = progress_bar(args, len(prompts), "generate", "req")
    try:
        return engine.generate(prompts, sampling, return_logprobs=args.logprobs,
                               progress=lambda n: bar.update(n - bar.n), on_output=on_output)
    except ValueError as e:
        error("generate", None, str(e))
    finally:
        bar.close()


def _resume_keeps(cmd: str, args, partial: str | None) -> list[str]:
    """--resume checked against the other flags: the outputs a resumed run continues (its
    partial file, its settings, and --out itself when the run being resumed was to replace
    it), or [] without --resume."""
    if not args.resume:
        return []
    if not args.out:
        error(cmd, "--resume", "continues an interrupted --out FILE run; give its --out")
    if partial is None:
        error(cmd, "--resume", f"--out {args.out!r} is written in place (a device or FIFO), so no run of it "
              "can be resumed")
    if not os.path.exists(partial) and os.path.exists(args.out):
        error(cmd, "--resume", f"{args.out!r} exists and no run of it is unfinished ({partial!r} is not "
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
    out["speculative_config"] = spec_value(args)[0]
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
    dyn = (spec_json(args) or {}).get("dynamic")
    dyn_profile = dyn.get("profile") if isinstance(dyn, dict) else None
    check_outputs(cmd, args, outputs, [("--prompts", None if args.prompts == "-" else args.prompts),
                                       ("--profile", args.profile),
                                       ("--speculative-config's dynamic.profile",
                                        dyn_profile if isinstance(dyn_profile, str) else None)], keep)
    check_backend(cmd, args)
    if args.profile:
        loading.existing_file("--profile", args.profile)
        if isinstance(dyn_profile, str) and os.path.realpath(dyn_profile) != os.path.realpath(args.profile):
            error(cmd, "--profile", f"{args.profile!r} is not the speculative config's dynamic.profile "
                  f"{dyn_profile!r}; give one of them")
    raw_prompts, where = loading.read_prompts("--prompts", args.prompts, args.prompt_format, with_lines=True)
    if args.seed is not None and args.seed + len(raw_prompts) - 1 >= SEED_LIMIT:
        error(cmd, "--seed", f"request i is seeded --seed + i, and {args.seed} + {len(raw_prompts) - 1} "
              f"(the last of {len(raw_prompts)} prompts) is past 2**32 - 1; give a smaller --seed")
    spec = load_spec(cmd, args)
    _check_sampling_flags(cmd, args)
    # the profile and the sampling flags first: their errors come before minutes of loading
    profile = None
    profile_path = args.profile or (spec.dynamic.profile if spec.dynamic is not None else None)
    flag = "--profile" if args.profile else "--speculative-config"
    if profile_path and not args.profile:
        loading.existing_file(flag, profile_path)  # dynamic.profile in the speculative config
    if profile_path:
        if spec.method == "none":
            error(cmd, flag, "a profile drives the goodput controller; it needs a speculative method "
                  "(the speculative config says method 'none')")
        if spec.num_speculative_tokens_per_batch_size is not None:
            error(cmd, flag, "the speculative config has a per-batch-size schedule; a profile "
                  "(goodput controller) and a schedule are mutually exclusive")
        try:
            profile = Profile.load(profile_path)
        except ValueError as e:
            error(cmd, flag, str(e))
        # the engine warns where the profile was measured for other models, device or mesh,
        # and where it does not fit the engine (batch, K, max_seq_len)
        dyn = spec.dynamic or DynamicConfig()
        spec = spec.replace(dynamic=DynamicConfig(**{**dyn.to_dict(), "profile": profile_path}))

    target, draft, tokenizer, _ = loading.load_models(args)
    for flag, given, why in (("--stop", args.stop, "stop strings are matched in the decoded text"),
                             ("--bad-word", args.bad_words, "bad words are tokenized")):
        if given and tokenizer is None:
            error(cmd, flag, f"{why}: they need a tokenizer (--tokenizer FILE, or an --hf-target "
                  "directory holding tokenizer.json)")
    draft = engine_draft(args, spec, draft, target)
    prompts = loading.encode_prompts(raw_prompts, tokenizer, target.config.vocab_size, "--prompts", where)
    for ids, name in zip(prompts, where):  # the engine would name the prompt by its index only
        if len(ids) >= args.max_seq_len:
            error(cmd, "--prompts", f"{name} has {len(ids)} tokens; --max-seq-len {args.max_seq_len} leaves "
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
    engine = make_engine(cmd, args, target, draft, tokenizer, spec, profile=profile)
    _generate_records(args, engine, raw_prompts, prompts, sampling, settings, first)
    if args.stats:
        text = json.dumps(engine.metrics(), indent=1, default=float) + "\n"
        _write_file("--stats", args.stats, lambda f: f.write(text))
    if args.trace:
        with loading.writing("--trace", args.trace):
            engine.stats.save_trace(args.trace)  # atomically
    return 0


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate completions for prompts (JSONL out)",
                       description="Generate for each prompt; one JSON object per line out.")
    add_model_flags(g)
    add_engine_flags(g, max_batch=16, max_seq=1024)
    g.add_argument("--prompts", metavar="FILE",
                   help="one prompt per line, or JSONL with {\"prompt\": ...} / {\"prompt_token_ids\": [...]}; "
                        "default or '-': stdin")
    add_prompt_format_flag(g)
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
    g.add_argument("--logit-bias", type=logit_bias, metavar="ID=BIAS,...",
                   help="biases in [-100, 100] added to those tokens' logits before the penalties "
                        "(-100 all but bans a token)")
    g.add_argument("--allowed-token-ids", type=int_list, metavar="ID,ID,...",
                   help="the only token ids the completions may hold (vLLM's allowed_token_ids)")
    g.add_argument("--stop-token-ids", type=int_list, metavar="ID,ID,...", help="stop token ids")
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
    add_overwrite_flag(g, "--out, --stats or --trace")
    g.set_defaults(func=cmd_generate)
