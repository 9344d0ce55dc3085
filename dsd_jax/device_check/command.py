"""Running the sections under a time budget, and the command line."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from typing import Any, Callable, Sequence

from .e2e import end_to_end
from .kernel_checks import check_kernels
from .profile import bucket_order, profile_pair
from .report import format_report, write_results
from .settings import SECTION_WEIGHTS, SECTIONS, SKIPPED, Settings, _guard, device_info
from .timings import time_kernels


def section_deadline(sections: Sequence[str], end: float | None, now: float | None = None) -> float | None:
    """The deadline of `sections[0]`, starting `now`, when the run must end at `end` and
    `sections[1:]` still follow: its `SECTION_WEIGHTS` share of the time left (all of it
    for a weight of None or the last section)."""
    if end is None:
        return None
    now = time.perf_counter() if now is None else now
    weight = SECTION_WEIGHTS[sections[0]]
    if weight is None or len(sections) == 1:
        return end
    total = weight + sum(SECTION_WEIGHTS[n] or 0 for n in sections[1:])
    return now + max(0.0, end - now) * weight / total


def run(out_dir: str, settings: Settings, sections: Sequence[str] = SECTIONS, mode: str = "gpu",
        log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
        time_budget_s: float | None = None) -> dict:
    """Runs `sections` in order, rewriting the JSON and text report after each. With
    `time_budget_s`, each section gets a deadline (`section_deadline`) and stops starting
    items past it; a section that would start after the budget is skipped (and says so)."""
    bad = [x for x in sections if x not in SECTIONS]
    if bad:
        raise ValueError(f"unknown sections {bad}; choose from {SECTIONS}")
    os.makedirs(out_dir, exist_ok=True)  # sections write into it (profile.json) before the report
    results: dict[str, Any] = {"mode": mode, "device": device_info(),
                               "settings": dataclasses.asdict(settings), "seconds": {}}
    # the e2e section saves its first pair before the second starts
    e2e = functools.partial(end_to_end, checkpoint=lambda partial: write_results({**results, "e2e": partial}, out_dir))
    steps = {"kernels": check_kernels, "timings": time_kernels, "e2e": e2e,
             "profile": functools.partial(profile_pair, out_dir=out_dir)}
    start = time.perf_counter()
    end = None if time_budget_s is None else start + time_budget_s
    for i, name in enumerate(sections):
        used = time.perf_counter() - start
        if time_budget_s is not None and used > time_budget_s:
            # "skipped": cut by the budget, not a failure (`failures`)
            results[name] = {"error": f"skipped: {used:.0f} s of the {time_budget_s:.0f} s budget "
                                      f"used; run --sections {name} separately", "skipped": SKIPPED}
            log(f"device_check: {name} skipped (time budget)")
            write_results(results, out_dir)
            continue
        deadline = section_deadline(sections[i:], end)
        log(f"device_check: {name} ..." + ("" if deadline is None else
                                            f" (until {deadline - start:.0f} s of {time_budget_s:.0f})"))
        t0 = time.perf_counter()
        results[name] = _guard(steps[name], settings, deadline=deadline)
        results["seconds"][name] = round(time.perf_counter() - t0, 1)
        log(f"device_check: {name} done in {results['seconds'][name]} s"
            + (f" (ERROR {results[name]['error']})" if "error" in results[name] else ""))
        write_results(results, out_dir)
    return results


def failures(results: dict) -> list[str]:
    """What failed in `results`: a section or an item in one that raised (an "error" row; a
    section cut by the time budget is not one), a kernel case off its reference, an e2e pair
    whose backends' tokens differ. Empty: everything that ran passed."""
    out = []

    def errors(where: str, x) -> None:
        if isinstance(x, dict):
            if "error" in x and "skipped" not in x:
                out.append(f"{where}: {x['error']}")
            for k, v in x.items():
                errors(f"{where}.{k}", v)
        elif isinstance(x, list):
            for i, v in enumerate(x):
                errors(f"{where}[{i}]", v)

    for name in SECTIONS:
        errors(name, results.get(name))
    k = results.get("kernels") or {}
    out += [f"kernels: {r.get('case')} FAILED" for r in k.get("attention", []) + k.get("rejection", [])
            if r.get("ok") is False]
    e = results.get("e2e") or {}
    out += [f"e2e.{n}: tokens differ across backends" for n in ("builtin", "synthetic")
            if isinstance(e.get(n), dict) and "error" not in e[n] and "skipped" not in e[n]
            and e[n].get("tokens_identical") is not True]
    return out


OUTPUTS = ("device_check.json", "device_check.txt", "profile.json")  # what a run writes into --out


def _ints(parser, flag: str, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        parser.error(f"{flag}: need comma-separated integers, got {value!r}")


def _pair(parser, flag: str, value: str) -> tuple[str, str]:
    from dsd_jax.models.synthetic import SYNTHETIC_CONFIGS
    pair = tuple(x.strip() for x in value.split(","))
    if len(pair) != 2 or not all(pair):
        parser.error(f"{flag}: needs TARGET,DRAFT, got {value!r}")
    unknown = [x for x in pair if x.lower() not in SYNTHETIC_CONFIGS]
    if unknown:
        parser.error(f"{flag}: unknown synthetic model {unknown[0]!r}; known: {', '.join(SYNTHETIC_CONFIGS)}")
    return pair


def build_parser() -> argparse.ArgumentParser:
    from dsd_jax import device_check  # the package's docstring documents the command
    # no abbreviations: benchmarks/device_check.py picks the CPU by the literal "--cpu-smoke"
    p = argparse.ArgumentParser(prog="device_check", description=device_check.__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for device_check.{json,txt}, profile.json")
    p.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier run in --out")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, interpret mode, on the CPU")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--profile-buckets", metavar="B,B,...", help="batch buckets of the ITL profile")
    p.add_argument("--profile-contexts", metavar="N,N,...", help="context lengths of the ITL profile")
    p.add_argument("--no-builtin", action="store_true", help="skip the built-in pair in e2e")
    p.add_argument("--e2e-pair", metavar="TARGET,DRAFT", help="synthetic pair of the e2e section "
                   "(default llama-3.1-8b,llama-3.2-1b)")
    p.add_argument("--profile-pair", metavar="TARGET,DRAFT", help="synthetic pair of the profile "
                   "(default llama-3.1-8b,llama-3.2-1b; e.g. qwen3-8b,qwen3-0.6b)")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="skip the sections that would start after this many seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command: every flag checked before any section runs (a bad one is a usage error,
    exit 2); then the sections, their results written after each; exit 1 when anything
    failed (`failures`), after the report."""
    from dsd_jax.loading import ArgumentError, check_outputs, output_dir
    parser = build_parser()
    args = parser.parse_args(argv)
    kw: dict[str, Any] = {}
    if args.profile_buckets:
        kw["profile_buckets"] = _ints(parser, "--profile-buckets", args.profile_buckets)
        try:
            bucket_order(kw["profile_buckets"])
        except ValueError as e:
            parser.error(f"--profile-buckets: {e}")
    if args.profile_contexts:
        kw["profile_contexts"] = _ints(parser, "--profile-contexts", args.profile_contexts)
        if min(kw["profile_contexts"]) < 1:
            parser.error(f"--profile-contexts: context lengths must be positive, got {args.profile_contexts!r}")
    if args.no_builtin:
        kw["builtin"] = False
    for flag, key in (("--e2e-pair", "e2e_pair"), ("--profile-pair", "profile_pair")):
        if getattr(args, key):
            kw[key] = _pair(parser, flag, getattr(args, key))
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    bad = [x for x in sections if x not in SECTIONS]
    if bad:
        parser.error(f"--sections: unknown {', '.join(map(repr, bad))}; choose from {','.join(SECTIONS)}")
    if not sections or len(set(sections)) != len(sections):  # none: the run would write nothing, exit 0
        parser.error(f"--sections: {'no section' if not sections else 'a section twice'} in {args.sections!r}; "
                     f"give a comma-separated subset of {','.join(SECTIONS)}")
    settings = Settings.cpu_smoke(**kw) if args.cpu_smoke else Settings.gpu(**kw)
    try:  # an earlier run's results are kept unless --overwrite: the first section rewrote them
        output_dir("--out", args.out)
        check_outputs([("--out", os.path.join(args.out, n)) for n in OUTPUTS], overwrite=args.overwrite)
    except ArgumentError as e:
        parser.error(str(e))
    results = run(args.out, settings, sections, mode="cpu-smoke" if args.cpu_smoke else "device",
                  time_budget_s=args.time_budget)
    print(format_report(results))
    failed = failures(results)
    for line in failed:
        print(f"device_check: FAILED {line}", file=sys.stderr)
    return 1 if failed else 0
