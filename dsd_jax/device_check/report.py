"""The text report of a run's results, and writing device_check.{json,txt}."""

from __future__ import annotations

import json
import os

from dsd_jax.loading import atomic_write, json_safe

from .floor import format_floor
from .settings import SECTIONS, SKIPPED


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _not_run(row: dict) -> str:
    return f"skipped ({row['skipped']})" if "skipped" in row else f"ERROR {row.get('error')}"


def _verdict(gap: dict) -> str:
    if "near_tie" not in gap:
        return ""
    return (" -> a near-tie (rounding), not a kernel bug" if gap["near_tie"]
            else " -> NOT a near-tie: look for a kernel bug")


def format_report(results: dict) -> str:
    info = results.get("device", {})
    bw = info.get("hbm_bytes_per_s")
    peak = (f", peak HBM {bw / 1e12:.2f} TB/s" if bw else
            ", peak HBM bandwidth UNKNOWN for this device kind (no floors, no fractions of them)" if info else "")
    lines = [f"device_check: {info.get('device_kind')} ({info.get('platform')}), jax {info.get('jax')}, "
             f"mode {results.get('mode')}{peak}", ""]
    failed = {n: results[n]["error"] for n in SECTIONS
              if isinstance(results.get(n), dict) and "error" in results[n]}
    for name, err in failed.items():
        lines.append(f"## {name}: ERROR {err}")
    if failed:
        lines.append("")
    results = {n: v for n, v in results.items() if n not in failed}
    k = results.get("kernels")
    if k:
        lines.append(f"## Kernels on the device ({k.get('backend')} vs xla): {k.get('passed')}/{k.get('total')} passed"
                     + (f", {k['skipped']} skipped ({SKIPPED})" if k.get("skipped") else ""))
        for r in k.get("attention", []):
            lines.append(f"  attention {r.get('case', '?')}: " + (
                f"rel err {_fmt(r['rel_err'], '.2e')} (tol {r['tol']:.0e}), NaN match {r['nan_match']} -> "
                f"{'OK' if r['ok'] else 'FAIL'}" if "rel_err" in r else _not_run(r)))
        for r in k.get("rejection", []):
            lines.append(f"  rejection {r.get('case', '?')}: " + (
                f"tokens identical {r['tokens_identical']} -> {'OK' if r['ok'] else 'FAIL'}"
                if "ok" in r else _not_run(r)))
        lines.append("")
    t = results.get("timings")
    if t:
        be = t.get("backend")
        bw = t.get("hbm_bytes_per_s")
        lines.append(f"## Kernel timings ({t.get('dtype')}; us per call, chain of {t.get('chain')}; "
                     + (f"floor = ideal bytes / {bw / 1e12:.2f} TB/s)" if bw else
                        "no floor: HBM bandwidth of this device unknown)"))
        lines.append("  attention: kernel = verify_attention alone; xla and " + be + " = the engine's "
                     "attend_and_write (scatter + attention); frac = floor / time")
        over = t.get("chain_overhead_us")
        if isinstance(over, (int, float)):
            lines.append(f"  a trivial call in such a chain takes {over:.2f} us (dispatch share and launch): "
                         "part of every time below, most of the smallest")
        lines.append(f"  attention  model          B   T     L | kernel us  GB/s  frac | {be} us  frac | "
                     f"xla us  frac | floor us | xla/{be}")
        for r in t.get("attention", []):
            if "error" in r or "skipped" in r:
                lines.append(f"  attention  {r.get('model')} {r.get('point')}: {_not_run(r)}")
                continue
            x, p, kk = r.get("xla", {}), r.get(be, {}), r.get("kernel", {})
            lines.append(f"  attention  {r['model']:<12} {r['B']:>3} {r['T']:>3} {r['L']:>5} | "
                         f"{_fmt(kk.get('us')):>9} {_fmt(kk.get('achieved_GBps'), '.0f'):>5} "
                         f"{_fmt(kk.get('fraction_of_floor'), '.2f'):>5} | {_fmt(p.get('us')):>6} "
                         f"{_fmt(p.get('fraction_of_floor'), '.2f'):>5} | {_fmt(x.get('us')):>6} "
                         f"{_fmt(x.get('fraction_of_floor'), '.2f'):>5} | "
                         f"{_fmt(kk.get('floor_us', x.get('floor_us'))):>8} | {_fmt(r.get('speedup_vs_xla'), '.2f')}"
                         + "".join(f"  [{n}: {v['error']}]" for n, v in (("kernel", kk), (be, p), ("xla", x))
                                   if "error" in v))
        lines.append(f"  rejection: kernel = the pass over the vocabulary alone (vocab_pass), "
                     f"{be} = the whole sampler (on a GPU the pass, then the finish kernel: split merge, "
                     "accept test, token select)")
        lines.append(f"  rejection  model          B   K  q       |  xla us  {be} us  kernel us | floor us | "
                     f"{be} GB/s  frac | xla frac | speedup")
        for r in t.get("rejection", []):
            if "error" in r or "skipped" in r:
                lines.append(f"  rejection  {r.get('model')} {r.get('point')}: {_not_run(r)}")
                continue
            x, p, kk = r.get("xla", {}), r.get(be, {}), r.get("kernel", {})
            lines.append(f"  rejection  {r['model']:<12} {r['B']:>3} {r['K']:>3}  {r['q']:<7} | "
                         f"{_fmt(x.get('us')):>7} {_fmt(p.get('us')):>9} {_fmt(kk.get('us')):>10} | "
                         f"{_fmt(p.get('floor_us', x.get('floor_us'))):>8} | "
                         f"{_fmt(p.get('achieved_GBps'), '.0f'):>7} {_fmt(p.get('fraction_of_floor'), '.2f'):>5} | "
                         f"{_fmt(x.get('fraction_of_floor'), '.2f'):>8} | {_fmt(r.get('speedup_vs_xla'), '.2f')}"
                         + (f"  [{be}: {p['error']}]" if "error" in p else "")
                         + (f"  [kernel: {kk['error']}]" if "error" in kk else "")
                         + (f"  [xla: {x['error']}]" if "error" in x else ""))
        sweeps = [r for r in t.get("rejection", []) if r.get("gpu_splits")]
        if sweeps:
            lines.append(f"  rejection, {be} us at each number of vocab splits (* = the default):")
        for r in sweeps:
            lines.append(f"    {r['model']:<12} {r['B']:>3} {r['K']:>3}  {r['q']:<7} | " + "  ".join(
                f"{v['splits']}{'*' if v['default'] else ''}: "
                + (_fmt(v['us']) if "us" in v else v.get("error", "?")) for v in r["gpu_splits"]))
        lines.append("")
    e = results.get("e2e")
    if e:
        lines.append(f"## End to end: tokens identical across backends: {e.get('tokens_identical')}")
        for key in ("builtin", "synthetic"):
            r = e.get(key)
            if not r:
                continue
            if "error" in r or "skipped" in r:
                lines.append(f"  {key}: {_not_run(r)}")
                continue
            lines.append(f"  {r['pair']}: K={r['k']}, {r['prompts']} prompts x {r['max_tokens']} tokens; "
                         f"identical {r.get('identical')}")
            for be, v in r.items():
                if isinstance(v, dict) and "kernel_backends" in v and "greedy" in v:  # a backend's runs
                    lines.append(f"    {be}: kernels {v['kernel_backends']}; greedy "
                                 f"{v['greedy']['second_call_s']} s, sampled {v['sampled']['second_call_s']} s "
                                 f"(first calls {v['greedy']['first_call_s']} / {v['sampled']['first_call_s']} s)")
            if r.get("first_divergence"):
                lines.append(f"    first divergence per prompt: {r['first_divergence']}")
            gap = r.get("greedy_divergence_top2_gap")
            if gap:
                lines.append(f"    target's top-2 logit gap at the first greedy divergence: {gap}{_verdict(gap)}")
            sp = r.get("spec_vs_plain")
            if sp:
                if "identical" not in sp:
                    lines.append(f"    speculative against plain greedy: {_not_run(sp)}")
                else:
                    lines.append(f"    speculative (K={sp['k']}, kernels {sp['kernel_backends']}) against plain "
                                 f"greedy at matmul precision {sp['matmul_precision']}: "
                                 f"identical {sp['identical']}"
                                 + (f"; first divergence {sp['first_divergence']}, top-2 gap {sp.get('top2_gap')}"
                                    f"{_verdict(sp.get('top2_gap') or {})}" if not sp["identical"] else ""))
        lines.append("")
    p = results.get("profile")
    if p:
        lines.append(f"## ITL(B, K) profile of {p['pair']} (kernels {p['kernel_backends']}, "
                     f"{p['seconds']} s, of which compiling {p.get('compile_seconds')} s: "
                     f"{p.get('precompiled')})")
        if p.get("truncated"):
            lines.append(f"  cut by the time budget: {p['truncated']}")
        lines.append(p["table"])
        lines.append(f"K schedule from the goodput rule with a_i = {list(p['acceptance'])}:")
        for c, ranges in p["k_schedule_ranges"].items():
            lines.append(f"  context {c}: [start_bs, end_bs, K] = {ranges} (argmax AL/ITL); the "
                         f"controller, from K=0 with its margin: "
                         f"{p.get('controller_schedule_ranges', {}).get(c)}")
        lines.append(f"vLLM PR, profiled on an H100: {p['vllm_h100_schedule']}")
        if p.get("floor"):
            lines.extend(format_floor(p["floor"]))
    return "\n".join(lines) + "\n"


def write_results(results: dict, out_dir: str) -> None:
    """DIR/device_check.json (non-finite numbers as null, `json_safe`) and DIR/device_check.txt,
    each written whole or not at all (`atomic_write`): a run its call's time limit kills keeps
    what the last write saved, never half a file."""
    os.makedirs(out_dir, exist_ok=True)
    text = json.dumps(json_safe(results), indent=1, default=str, allow_nan=False)
    atomic_write(os.path.join(out_dir, "device_check.json"), lambda f: f.write(text))
    report = format_report(results)  # from the results as they are: a NaN error reads "nan" there
    atomic_write(os.path.join(out_dir, "device_check.txt"), lambda f: f.write(report))
