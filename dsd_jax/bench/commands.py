"""What `dsd-jax bench` and `dsd-jax demo` do once `dsd_jax.cli` has parsed their flags."""

from __future__ import annotations

import os
import time
from pathlib import Path

import jax

from dsd_jax.bench.profiles import shipped_profile
from dsd_jax.bench.report import check_plot_path, format_hist, format_table, summarize, write_json, write_plot
from dsd_jax.bench.run import run_bench
from dsd_jax.bench.settings import (config_list, eagle3_max_batch_error, has_dynamic, int_list, methods_of, mode,
                                    with_method)
from dsd_jax.bench.workloads import FRESH_MIN_REPEATS, sweep_prompts
from dsd_jax.loading import ArgumentError, check_outputs, load_eagle3_head, load_models, model_inputs, writing
from dsd_jax.sampling import SamplingParams

DEMO_PROMPT_INDEX = 22  # a held-out prompt (the built-in pair is small: its completions are rough)


def _builtin_prompts(n: int) -> list[str]:
    from dsd_jax.models import heldout_prompts
    return heldout_prompts(n)


def _prompts_needed(quick: bool, batch_sizes, rows_per_point: int | None = None,
                    rollout_units: int | None = None, repeats: int | None = None,
                    min_units: int | None = None) -> int:
    """Held-out prompts for the sweep's largest batch, its prompt groups (each repeat's own
    where the held-out set holds them, `workloads.fresh_groups`) or the rollouts, and the
    profile's own."""
    from dsd_jax.models.corpus import heldout_prompt_count
    d = mode(quick)
    sizes = int_list("batch_sizes", batch_sizes)
    room = heldout_prompt_count() - d["profile_prompts"] - 1  # 1: the demo's own prompt
    groups = sweep_prompts(sizes, rows_per_point or d["rows_per_point"], repeats or d["repeats"], room,
                           d["min_units"] if min_units is None else min_units)
    rollouts = d["rollout_requests"] * (rollout_units or d["rollout_units"])
    return max(max(sizes), rollouts, groups) + d["profile_prompts"]


def _most_prompts_flag(quick: bool, batch_sizes, rows_per_point, rollout_units) -> str:
    """The flag whose prompts `_prompts_needed` counts most: the rollouts', or the sweep's."""
    d = mode(quick)
    sweep = sweep_prompts(int_list("batch_sizes", batch_sizes), rows_per_point or d["rows_per_point"])
    if rollout_units and d["rollout_requests"] * rollout_units >= sweep:
        return "--rollout-units"
    return "--rows-per-point" if rows_per_point else "--batch-sizes"


def default_configs(quick: bool, method: str = "draft_model") -> list[str]:
    """The mode's configurations for the draft model, the EAGLE-3 head ("eagle3") or "both"."""
    base = list(mode(quick)["configs"])
    if method == "draft_model":
        return base
    head = with_method(base, "eagle3")
    return head if method == "eagle3" else list(dict.fromkeys(base + head))


def _configs(args, quick: bool) -> list[str]:
    if getattr(args, "configs", None) and getattr(args, "method", None) is not None:
        raise ArgumentError("--method", "picks the default configurations; --configs names them "
                            "(eagle3-static-K, eagle3-dynamic for the EAGLE-3 head): give one of the two")
    try:
        return config_list(getattr(args, "configs", None)
                           or default_configs(quick, getattr(args, "method", None) or "draft_model"))
    except ValueError as e:
        raise ArgumentError("--configs", str(e)) from e


def _profile_out(out_json: str | None, given, configs, method: str) -> str | None:
    """Where a profile measured now is saved: beside --json (None: not saved, or not measured)."""
    if given is not None or not out_json or not has_dynamic(configs, method):
        return None
    return os.path.splitext(out_json)[0] + (".eagle3" if method == "eagle3" else "") + ".profile.json"


def _check_flags_apply(args, configs) -> None:
    """Refuses a flag for configurations that do not run: ignored, it would look used."""
    draft, eagle3 = ("draft_model" in methods_of(configs)), ("eagle3" in methods_of(configs))
    for flag, attr, what, runs in (
            ("--draft", "draft", "the draft-model configurations (static-K, dynamic)", draft),
            ("--hf-draft", "hf_draft", "the draft-model configurations (static-K, dynamic)", draft),
            ("--profile", "profile", "the dynamic configuration", has_dynamic(configs, "draft_model")),
            ("--eagle3-profile", "eagle3_profile", "the eagle3-dynamic configuration", has_dynamic(configs, "eagle3")),
            ("--eagle3", "eagle3", "the eagle3-... configurations", eagle3),
            ("--eagle3-max-batch", "eagle3_max_batch", "the eagle3-... configurations", eagle3)):
        if getattr(args, attr, None) is not None and not runs:
            raise ArgumentError(flag, f"is for {what}, and none runs ({', '.join(configs)}): add one with "
                                "--configs" + (" or --method eagle3 (or both)" if "eagle3" in what else ""))


def _check_sweep_flags(args, quick: bool, configs, batch_sizes) -> None:
    """Before any model is loaded: a --min-units the run would ignore, an --eagle3-max-batch
    below every batch size (`run_bench` would refuse it only once the models are loaded)."""
    min_units, repeats = getattr(args, "min_units", None), getattr(args, "repeats", None) or mode(quick)["repeats"]
    if min_units and repeats < FRESH_MIN_REPEATS:  # (--quick's own min_units is 0)
        raise ArgumentError("--min-units", f"adds prompt groups only where each repeat takes groups of its own, "
                            f"at --repeats {FRESH_MIN_REPEATS} or more; this run has {repeats} repeats"
                            + ("" if getattr(args, "repeats", None) else " (--quick's)")
                            + f": give --repeats {FRESH_MIN_REPEATS} or more, or no --min-units")
    why = eagle3_max_batch_error(getattr(args, "eagle3_max_batch", None), configs,
                                 int_list("batch_sizes", batch_sizes), mode(quick)["rollout_requests"])
    if why:
        raise ArgumentError("--eagle3-max-batch", why)


def _profiles(args, quick: bool, configs, source: str) -> tuple:
    """(draft-model profile, EAGLE-3 profile) the run reads: the flags', else for the built-in
    pair's dynamic configuration the shipped one (None: measured in the run)."""
    profile, eagle3_profile = getattr(args, "profile", None), getattr(args, "eagle3_profile", None)
    if profile is None and source == "builtin" and has_dynamic(configs, "draft_model"):
        profile = shipped_profile(quick)
    return profile, eagle3_profile


# `check_outputs` labels of the profiles a run measures and saves beside --json
PROFILE_OUT = "--json the profile measured in the run, saved beside --json"
EAGLE3_PROFILE_OUT = "--json eagle3-dynamic's profile measured in the run, saved beside --json"


def _outputs(args, configs, profile, eagle3_profile) -> dict[str, str | None]:
    """Every file the run writes (None: not written), by its `check_outputs` label."""
    out_json = getattr(args, "json", None)
    return {"--json": out_json, "--plot": getattr(args, "plot", None),
            PROFILE_OUT: _profile_out(out_json, profile, configs, "draft_model"),
            EAGLE3_PROFILE_OUT: _profile_out(out_json, eagle3_profile, configs, "eagle3")}


def _check_paths(args, outputs) -> None:
    """Before any model is loaded: a --plot format matplotlib writes, no output that is
    another output or an input (--profile, --eagle3-profile, the model flags, an --eagle3
    head) or lies in an input directory or --compilation-cache-dir, and no existing output
    without --overwrite."""
    plot = getattr(args, "plot", None)
    if plot:
        try:
            check_plot_path(plot)
        except ValueError as e:
            raise ArgumentError("--plot", str(e)) from e
    eagle3 = getattr(args, "eagle3", None)
    inputs = [("--profile", getattr(args, "profile", None)),
              ("--eagle3-profile", getattr(args, "eagle3_profile", None)),
              ("--eagle3", None if eagle3 == "builtin" else eagle3)] + model_inputs(args)
    check_outputs(outputs.items(), inputs, overwrite=bool(getattr(args, "overwrite", False)),
                  dirs=[("--compilation-cache-dir", getattr(args, "compilation_cache_dir", None))])


def main(args) -> int:
    """`dsd-jax bench`. args: its parsed flags (see `dsd_jax.cli`); a bad one raises
    `dsd_jax.loading.ArgumentError`."""
    quick = bool(getattr(args, "quick", False))
    configs = _configs(args, quick)
    _check_flags_apply(args, configs)
    custom = getattr(args, "target", None) or getattr(args, "hf_target", None)
    profile, eagle3_profile = _profiles(args, quick, configs, "custom" if custom else "builtin")
    outputs = _outputs(args, configs, profile, eagle3_profile)
    _check_paths(args, outputs)
    d = mode(quick)
    batch_sizes = getattr(args, "batch_sizes", None) or d["batch_sizes"]
    _check_sweep_flags(args, quick, configs, batch_sizes)
    rows_per_point, rollout_units = getattr(args, "rows_per_point", None), getattr(args, "rollout_units", None)
    min_units = getattr(args, "min_units", None)
    try:  # before any model loads
        prompts = _builtin_prompts(_prompts_needed(quick, batch_sizes, rows_per_point, rollout_units,
                                                   getattr(args, "repeats", None), min_units))
    except ValueError as e:  # more than the held-out set holds
        raise ArgumentError(_most_prompts_flag(quick, batch_sizes, rows_per_point, rollout_units), str(e)) from e
    target, draft, tokenizer, source = load_models(args)
    if source != "builtin" and tokenizer is None:
        raise ArgumentError("--tokenizer", "custom models without a tokenizer are not supported "
                            "(the prompts are the built-in held-out code prompts; pass --tokenizer)")
    head = (load_eagle3_head("--eagle3", getattr(args, "eagle3", None), source, target.config.dtype)
            if "eagle3" in methods_of(configs) else None)
    out_json, out_plot = getattr(args, "json", None), getattr(args, "plot", None)
    rows = run_bench(target, draft, tokenizer, prompts,
                     batch_sizes=batch_sizes, configs=configs, repeats=getattr(args, "repeats", None),
                     rows_per_point=rows_per_point, min_units=min_units, rollout_units=rollout_units,
                     max_tokens=getattr(args, "max_tokens", None), profile=profile, quick=quick,
                     profile_out=outputs[PROFILE_OUT], eagle3=head, eagle3_profile=eagle3_profile,
                     eagle3_profile_out=outputs[EAGLE3_PROFILE_OUT],
                     eagle3_max_batch=getattr(args, "eagle3_max_batch", None),
                     compilation_cache_dir=getattr(args, "compilation_cache_dir", None),
                     mesh=_mesh(getattr(args, "mesh", None)))
    print(format_table(rows))
    if out_json:
        with writing("--json", out_json):
            write_json(rows, out_json)
        print(f"wrote {out_json}")
    if out_plot:
        with writing("--plot", out_plot):
            write_plot(rows, out_plot, title=f"dsd-jax bench ({source} models)")
        print(f"wrote {out_plot}")
    return 0 if summarize(rows)["lossless"] else 1


def _mesh(shape):
    """The ("data", "model") mesh of `--mesh DATAxMODEL` (None: one device)."""
    if shape is None:
        return None
    from dsd_jax.sharding import make_mesh
    try:
        return make_mesh(*shape)
    except ValueError as e:
        raise ArgumentError("--mesh", str(e)) from e


# The demo's EAGLE-3 side: the head at fewer K and batch sizes than the draft model (its
# engine compiles K <= 2 for buckets up to 16 only, keeping the quick demo near its old time).
DEMO_EAGLE3 = {True: dict(configs=("eagle3-static-1", "eagle3-dynamic"), max_batch=16, max_k=2),
               False: dict(configs=("eagle3-static-1", "eagle3-static-2", "eagle3-dynamic"), max_batch=None,
                           max_k=None)}


def _complete_with(runner, config: str, prompt: str):
    """(output, seconds, engine stats) of `prompt` completed greedily by `config`."""
    engine = runner.engine_for(config)
    engine.controller = runner.controller(config) or engine.controller
    engine.stats.reset()
    t0 = time.perf_counter()
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=96))[0]
    return out, time.perf_counter() - t0, engine.stats


def _complete(runner, prompt: str) -> None:
    """Completes `prompt` greedily with each method's dynamic controller, prints the draft
    model's completion and, side by side, every method's time and K use (same tokens: lossless)."""
    dynamic = [c for c in ("dynamic", "eagle3-dynamic") if c in runner.configs] or ["vanilla"]
    done = {c: _complete_with(runner, c, prompt) for c in dynamic}
    out = next(iter(done.values()))[0]
    bar = "-" * 72
    print(f"\n{bar}\nheld-out prompt + completion (greedy, dynamic K; completion after '<<<'):\n{bar}")
    print(prompt + "<<<" + (out.text or ""))
    print(bar)
    for c, (o, dt, st) in done.items():
        same = "" if o.token_ids == out.token_ids else " (DIFFERENT tokens: not lossless)"
        print(f"{c:>14}: {len(o.token_ids)} tokens in {dt:.2f} s; K used per step: {format_hist(st.k_hist)}; "
              f"mean tokens per step {st.tokens / max(st.row_steps, 1):.2f}{same}")
    print(flush=True)


def _check_demo_outputs(paths, overwrite: bool) -> None:
    """Before any model is loaded: the files the demo writes in --out-dir (None: not written
    this run) must not exist unless `overwrite`, as every command's outputs (an earlier
    `dsd-jax bench --json bench.json` or `dsd-jax profile` there is not lost)."""
    there = [str(p) for p in paths if p is not None and os.path.lexists(p)]
    if there and not overwrite:
        names = ", ".join(repr(p) for p in there)
        raise ArgumentError("--out-dir", f"{names} exist{'s' * (len(there) == 1)}; pass --overwrite to "
                            "replace " + ("it" if len(there) == 1 else "them") + ", or give another --out-dir")


def demo(args) -> int:
    """`dsd-jax demo`: complete a held-out prompt with the built-in pair and the built-in
    EAGLE-3 head, then `bench --quick` over both."""
    t_start = time.perf_counter()
    quick = bool(getattr(args, "quick", True))
    out_dir = Path(getattr(args, "out_dir", None) or "dsd_jax_demo")
    shipped = shipped_profile(quick)
    profile_out = None if shipped else out_dir / "profile.json"
    json_path, plot_path = out_dir / "bench.json", out_dir / "bench.png"
    e3_profile_out = out_dir / "eagle3_profile.json"
    _check_demo_outputs([json_path, plot_path, e3_profile_out, profile_out],
                        bool(getattr(args, "overwrite", False)))
    out_dir.mkdir(parents=True, exist_ok=True)
    from dsd_jax.models import builtin, load_eagle3
    print("loading the built-in model pair and EAGLE-3 head ...", flush=True)
    target, draft, tokenizer = builtin()
    head = load_eagle3("builtin")
    prompts = _builtin_prompts(max(_prompts_needed(quick, mode(quick)["batch_sizes"]), DEMO_PROMPT_INDEX) + 1)
    demo_prompt = prompts.pop(DEMO_PROMPT_INDEX)  # not among the benchmark's prompts
    e3 = DEMO_EAGLE3[quick]
    # The built-in pair is float32. Its engines (they keep the precision they are built under)
    # run its dots in float32 ("highest"), not in a GPU's default TF32: the lossless check
    # then compares the algorithms, not two roundings of a near-tie (a K+1-token verify
    # against a 1-token step). On a CPU it changes nothing.
    with jax.default_matmul_precision("highest"):
        rows = run_bench(target, draft, tokenizer, prompts, quick=quick, profile=shipped, profile_out=profile_out,
                         configs=list(mode(quick)["configs"]) + list(e3["configs"]), eagle3=head,
                         eagle3_profile_out=e3_profile_out, eagle3_max_batch=e3["max_batch"],
                         eagle3_max_k=e3["max_k"], runner_hook=lambda runner: _complete(runner, demo_prompt),
                         compilation_cache_dir=str(out_dir / "xla_cache"), log=lambda s: print(s, flush=True))
    write_json(rows, json_path)
    write_plot(rows, plot_path, title="dsd-jax demo: built-in pair and EAGLE-3 head, "
               + ("quick" if quick else "full") + " bench")
    print()
    print(format_table(rows))
    print(f"\nwrote {json_path} and {plot_path}"
          + (f"; profile {profile_out}" if profile_out else f"; used the shipped profile {shipped}")
          + f"; EAGLE-3 profile {e3_profile_out}")
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0 if summarize(rows)["lossless"] else 1
