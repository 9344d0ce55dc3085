"""The bench's report: the summary, the table, the JSON document and the plot of result rows."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from dsd_jax import stats
from dsd_jax.bench.environment import environment
from dsd_jax.bench.pairs import differences, pair_ratios, points, throughput_score
from dsd_jax.bench.settings import method_of, methods_of, parse_config
from dsd_jax.loading import atomic_write

SCHEMA = "dsd_jax.bench/1"


# --------------------------------------------------------------------------- summary

def _dynamic_names(configs) -> list[str]:
    return [c for c in configs if parse_config(c)[0] == "dynamic"]


def _sweep_entry(b: int, rows_b: dict[str, dict]) -> dict:
    """Each dynamic configuration against the best other configuration at one batch size, and
    the noise there."""
    pts = {c: r["tokens_per_s"] for c, r in rows_b.items()}
    # ranked and compared as the paired intervals rank them (the geometric mean over pair
    # units), so a point estimate is never at odds with the interval printed beside it
    score = {c: throughput_score(r) for c, r in rows_b.items()}
    others = {c: v for c, v in score.items() if parse_config(c)[0] != "dynamic"}
    best_c = max(others, key=others.get)
    best = max(score, key=score.get)
    # best_config's own speedup, on the scores that chose it (with pairs: its paired ratio to
    # vanilla); the highest median may be another configuration's
    entry = {"batch_size": b, "best_config": best, "best_other": best_c,
             "best_speedup_vs_vanilla": score[best] / score["vanilla"]}
    ratios = pair_ratios(rows_b, best_c)
    entry["dynamic_configs"] = {d: {"vs_best_other": _paired_or(ratios[d], score[d] / others[best_c]),
                                    "ci": ratios[d], "verdict": stats.verdict(ratios[d])}
                                for d in _dynamic_names(pts)}
    if "dynamic" in pts:  # the draft model's, under the keys the summary always had
        entry["dynamic_vs_best_other"] = entry["dynamic_configs"]["dynamic"]["vs_best_other"]
        entry["dynamic_vs_best_other_ci"] = entry["dynamic_configs"]["dynamic"]["ci"]
    # run-to-run noise at this point: the median over configurations of the spread
    # (max - min) / median of their repeats; a gap smaller than this is not a finding
    spreads = [(max(r) - min(r)) / statistics.median(r) for r in
               (x.get("tokens_per_s_repeats") or [] for x in rows_b.values()) if len(r) > 1]
    entry["repeat_spread"] = statistics.median(spreads) if spreads else None
    # what the paired intervals resolve here: the median half-width against vanilla, and
    # whether every comparison with vanilla can tell 5% (False also where one has no interval)
    vs_v = [x for c, x in pair_ratios(rows_b, "vanilla").items() if c != "vanilla" and x]
    widths = [w for w in map(stats.resolution, vs_v) if w is not None]
    entry["resolution"] = statistics.median(widths) if widths else None
    entry["resolves_5pct"] = bool(vs_v) and all(map(stats.resolves, vs_v))
    return entry


def _paired_or(ci: dict | None, fallback: float) -> float:
    """The paired ratio where there are pairs, else `fallback`."""
    return ci["ratio"] if ci and ci.get("ratio") is not None else fallback


def _paying(by_point: dict, sizes: list[int], chosen) -> list[list]:
    """[batch size, verdict] wherever a `chosen(config)` configuration ran beside vanilla:
    "pays" where one of them is resolvably faster than vanilla (paired interval above 1),
    "slower" where every one is resolvably slower (intervals below 1), else "unresolved"
    (an interval contains 1, or there is none)."""
    out = []
    for b in sizes:
        pts = by_point[("sweep", b)]
        vs_v = pair_ratios(pts, "vanilla")  # from the pairs, as in `_sweep_entry`
        verdicts = [stats.verdict(x) for c, x in vs_v.items() if chosen(c)] if "vanilla" in pts else []
        if verdicts:
            out.append([b, "pays" if "higher" in verdicts else
                        "slower" if all(v == "lower" for v in verdicts) else "unresolved"])
    return out


def _stops_at(paying: list[list]) -> int | None:
    """The smallest batch size from which on every verdict is "slower" (None: there is none)."""
    return next((b for i, (b, _) in enumerate(paying) if all(v == "slower" for _, v in paying[i:])), None)


def _static(m: str | None = None):
    return lambda c: parse_config(c)[0] == "static" and m in (None, method_of(c))


def _paying_by(by_point: dict, sizes: list[int]) -> dict[str, list[list]]:
    """`_paying` per method (its static Ks) and per dynamic configuration."""
    configs = list(dict.fromkeys(c for b in sizes for c in by_point[("sweep", b)]))
    out = {f"{m} (best static K)": _paying(by_point, sizes, _static(m)) for m in methods_of(configs)}
    out.update({d: _paying(by_point, sizes, lambda c, d=d: c == d) for d in _dynamic_names(configs)})
    return out


def _rollout_entry(rows_r: dict[str, dict]) -> dict:
    roll = {c: r["makespan_s"] for c, r in rows_r.items()}
    score = {c: throughput_score(r) for c, r in rows_r.items()}  # as in `_sweep_entry`
    others = {c: v for c, v in score.items() if parse_config(c)[0] != "dynamic"}
    best_c = max(others, key=others.get)
    out = {"best_other": best_c, "best_other_makespan_s": roll[best_c], "vanilla_makespan_s": roll.get("vanilla")}
    ratios = pair_ratios(rows_r, best_c)
    # makespan ratios (below 1: the dynamic configuration finished sooner)
    out["dynamic_configs"] = {}
    for d in _dynamic_names(roll):
        ci = stats.reciprocal(ratios[d])
        out["dynamic_configs"][d] = {"makespan_s": roll[d], "ci": ci, "verdict": stats.verdict(ci),
                                     "vs_best_other": _paired_or(ci, others[best_c] / score[d])}
    if "dynamic" in roll:
        out["dynamic_makespan_s"] = roll["dynamic"]
        out["dynamic_vs_best_other"] = out["dynamic_configs"]["dynamic"]["vs_best_other"]
        out["dynamic_vs_best_other_ci"] = out["dynamic_configs"]["dynamic"]["ci"]
    return out


def summarize(rows: list[dict]) -> dict:
    """Each dynamic configuration vs the best other configuration per sweep batch size and for
    the rollout, where speculation pays and from where on it is slower than vanilla (as the
    paired intervals resolve it), and which differences between configurations they resolve."""
    by_point = points(rows)
    sizes = sorted(b for w, b in by_point if w == "sweep")
    out: dict[str, Any] = {"sweep": [_sweep_entry(b, by_point[("sweep", b)]) for b in sizes], "rollout": None,
                           "lossless": all(r["lossless"] for pts in by_point.values() for r in pts.values())}
    # verdicts only where the paired intervals exclude 1 (`_paying`)
    out["speculation_stops_paying_at"] = _stops_at(_paying(by_point, sizes, _static()))
    out["speculation_pays"] = _paying_by(by_point, sizes)
    out["stops_paying_at"] = {name: _stops_at(v) for name, v in out["speculation_pays"].items()}
    if ("rollout", None) in by_point:
        out["rollout"] = _rollout_entry(by_point[("rollout", None)])
    out["differences"] = differences(by_point)
    return out


# --------------------------------------------------------------------------- table

def format_hist(h: dict) -> str:
    total = sum(h.values()) or 1
    return " ".join(f"K{k}:{100 * v / total:.0f}%" for k, v in sorted(h.items(), key=lambda kv: int(kv[0])))


def _speedup_cell(r: dict) -> str:
    """``1.23x [1.18, 1.29]* +-4.5%`` (paired 95% interval; * = real; its half-width),
    ``(1.23x)`` without pairs; nothing for vanilla (the baseline)."""
    if r["config"] == "vanilla":
        return "(baseline)"
    return stats.format_ratio(r["vs_vanilla"]) if r.get("vs_vanilla") else f"({r['speedup_vs_vanilla']:.2f}x)"


def _resolution_cell(rows: list[dict]) -> str:
    """Whether a point's comparisons with vanilla tell a 5% difference: their widest
    half-width, "cannot resolve 5%" past it or without an interval."""
    cis = [r.get("vs_vanilla") for r in rows if r["config"] != "vanilla"]
    if not any(cis):
        return "no pairs"
    if any(not x or x.get("lo") is None for x in cis):
        n = min(x["n"] for x in cis if x)
        return f"no interval ({n} prompt group{'s' if n != 1 else ''}): cannot resolve 5%"
    widest = max(stats.resolution(x) for x in cis)
    return f"+-{100 * widest:.1f}%" + (": cannot resolve 5%" if widest > stats.TARGET else "")


def _sweep_lines(sweep, configs, meta) -> list[str]:
    cells_of = {(r["batch_size"], r["config"]): f"{r['tokens_per_s']:.1f} {_speedup_cell(r)}" for r in sweep}
    w = max([len(c) for c in configs] + [len(x) for x in cells_of.values()])
    dynamic = _dynamic_names(configs)
    lines = ["sweep: tokens/s and speedup over vanilla [paired 95% interval over prompt groups; * = real] "
             f"+-half-width, greedy, {meta.get('max_tokens', '?')} tokens per request; last column: the "
             "widest half-width, and whether the point can tell a 5% difference",
             f"{'batch':>5} | " + " | ".join(f"{c:>{w}}" for c in configs) + " | resolution"
             + (f" | {', '.join(dynamic)} K histogram" if dynamic else "")]
    for b in sorted({r["batch_size"] for r in sweep}):
        line = f"{b:>5} | " + " | ".join(f"{cells_of.get((b, c), '-'):>{w}}" for c in configs)
        line += " | " + _resolution_cell([r for r in sweep if r["batch_size"] == b])
        hists = [(d, r["k_hist"]) for d in dynamic for r in sweep if r["batch_size"] == b and r["config"] == d]
        if hists:
            line += " | " + "; ".join(format_hist(h) if len(dynamic) == 1 else f"{d} {format_hist(h)}"
                                      for d, h in hists)
        lines.append(line)
    return lines


def _best_static_lines(sweep) -> list[str]:
    if not any(r.get("vs_best_static") for r in sweep):
        return []
    lines = ["ratio to the best static K at each batch size [paired 95% interval; * = real]:"]
    for b in sorted({r["batch_size"] for r in sweep}):
        pts = [r for r in sweep if r["batch_size"] == b and r.get("vs_best_static")]
        if pts:
            lines.append(f"{b:>5} | best {pts[0]['best_static']}: " + "  ".join(
                f"{r['config']} {stats.format_ratio(r['vs_best_static'])}" for r in pts
                if r["config"] != r["best_static"]))
    return lines


def _decode_lines(sweep, configs) -> list[str]:
    if not any(r.get("decode_speedup_vs_vanilla") for r in sweep):
        return []
    lines = ["decode-only speedup over vanilla (prefill and the dispatches run right after one excluded):"]
    for b in sorted({r["batch_size"] for r in sweep}):
        pts = {r["config"]: r for r in sweep if r["batch_size"] == b}
        lines.append(f"{b:>5} | " + "  ".join(
            f"{c} {pts[c]['decode_speedup_vs_vanilla']:.2f}x" for c in configs
            if c in pts and pts[c].get("decode_speedup_vs_vanilla")))
    return lines


def _calibration_cell(b: int, c: str, row: dict | None) -> str | None:
    """Measured / profiled step time at the batch's own bucket (not the tail after early
    finishers left) and its most common K."""
    cal = [e for e in (row or {}).get("step_calibration") or [] if e.get("profile_ms")]
    if not cal:
        return None
    own = min((e["bucket"] for e in cal if e["bucket"] >= b), default=None)
    e = max([e for e in cal if e["bucket"] == own] or cal, key=lambda e: e["steps"])
    host_ms = row.get("controller_ms_per_step")
    host = "" if host_ms is None else f", controller {host_ms:.2f} ms"
    return f"{c} K{e['k']}: {e['measured_ms']:.1f}/{e['profile_ms']:.1f} ms ({e['measured_over_profile']:.2f}{host})"


def _calibration_lines(sweep, configs) -> list[str]:
    if not any(c.get("profile_ms") for r in sweep for c in r.get("step_calibration") or []):
        return []
    lines = ["step time measured in the runs / profiled ITL (the batch's own bucket, its most common K), and the "
             "host time in the K controller a round:"]
    for b in sorted({r["batch_size"] for r in sweep}):
        rows = {r["config"]: r for r in sweep if r["batch_size"] == b}
        cells = [_calibration_cell(b, c, rows.get(c)) for c in configs]
        lines.append(f"{b:>5} | " + "  ".join(x for x in cells if x))
    return lines


def _rollout_lines(roll, meta) -> list[str]:
    if not roll:
        return []
    n = meta.get("rollout", {}) or {}
    units = n.get("units", 1)
    lengths = n.get("lengths") or [[0]]
    longest = max(max(x) if isinstance(x, list) else x for x in lengths)  # (one flat list before units)
    lines = [f"rollout: {units} x {n.get('num_requests', '?')} requests, heavy-tailed lengths "
             f"(median {n.get('median_tokens', '?')}, max {longest}); makespan: the mean of a rollout"
             + ("" if units > 1 else "; one rollout: no interval")]
    for r in roll:
        lines.append(f"  {r['config']:>12}: makespan {r['makespan_s']:.2f} s, "
                     f"{r['tokens_per_s']:.1f} tok/s {_speedup_cell(r)}"
                     + (f", K histogram {format_hist(r['k_hist'])}"
                        if parse_config(r["config"])[0] == "dynamic" else ""))
    return lines


def _learnt_lines(rows) -> list[str]:
    lines = []
    for d in dict.fromkeys(r["config"] for r in rows if parse_config(r["config"])[0] == "dynamic"):
        learnt = [r["controller"] for r in rows if r["config"] == d and r.get("controller")]
        if not learnt or not learnt[-1].get("latency_factors"):
            continue
        lines.append(f"{d}'s learnt step time / profiled ITL per batch bucket, K = 0.. "
                     f"({learnt[-1].get('probes', 0)} probe steps):")
        for bucket, factors in sorted(learnt[-1]["latency_factors"].items(), key=lambda x: int(x[0])):
            lines.append(f"{bucket:>5} | " + " ".join(f"{f:.2f}" for f in factors))
    return lines


PAYING_WORDS = {"pays": "pays", "slower": "slower", "unresolved": "?"}


def _paying_text(name: str, paying: list[list], stops: int | None) -> str:
    per_b = ", ".join(f"B={b} {PAYING_WORDS[v]}" for b, v in paying)
    if stops is not None:
        end = f"slower than vanilla from B={stops} on"
    elif paying and paying[-1][1] == "pays":
        end = "still pays at the largest batch size it ran"
    else:
        end = "where it stops paying is unresolved"
    return f"  {name}: {per_b} -> {end}"


def _summary_lines(s: dict) -> list[str]:
    lines = []
    for e in s["sweep"]:
        for d, x in e.get("dynamic_configs", {}).items():
            spread, ci = e.get("repeat_spread"), x.get("ci")
            lines.append(f"  B={e['batch_size']:>3}: {d} = {x['vs_best_other']:.2f} x best other "
                         f"({e['best_other']})" + (f", paired {stats.format_ratio(ci)}" if ci else "")
                         + f": {stats.verdict(ci)}"
                         + (f"; repeats spread {100 * spread:.0f}%" if spread else ""))
    for d, x in ((s["rollout"] or {}).get("dynamic_configs") or {}).items():
        ci = x.get("ci")
        lines.append(f"  rollout: {d} makespan = {x['vs_best_other']:.2f} x best other "
                     f"({s['rollout']['best_other']})" + (f", paired {stats.format_ratio(ci)}" if ci else "")
                     + f": {stats.verdict(ci)}")
    pays = s.get("speculation_pays") or {}
    if pays:
        lines.append("speculation vs vanilla by batch size (paired 95% intervals: pays = one configuration's "
                     "interval above 1, slower = every one's below 1, ? = unresolved):")
        lines += [_paying_text(name, v, (s.get("stops_paying_at") or {}).get(name)) for name, v in pays.items()]
    return lines


def _quick_lines(meta: dict) -> list[str]:
    """A quick run is a smoke run: say so once rather than let its numbers pass for results."""
    if not meta.get("quick"):
        return []
    return [f"quick run ({meta.get('repeats', '?')} repeats, {meta.get('rows_per_point', '?')} prompt(s) per point): "
            "a smoke test of the pipeline; its points cannot resolve 5% (run without --quick for results)"]


def _differences_lines(s: dict) -> list[str]:
    """The summary's verdicts: which differences the paired intervals resolve, which not."""
    where = lambda d: "rollout" if d["workload"] == "rollout" else f"B={d['batch_size']}"  # noqa: E731
    real = [d for d in s.get("differences", []) if d["real"]]
    unresolved = [d for d in s.get("differences", []) if not d["real"] and d.get("lo") is not None]
    lines = ["differences the data resolve (paired 95% interval excludes 1): "
             + (str(len(real)) if real else "none")]
    lines += [f"  {where(d)}: {d['config']} {d['verdict']} than {d['baseline']}: {stats.format_ratio(d)}"
              for d in real]
    if unresolved:
        lines.append("not resolved (interval contains 1): " + "; ".join(
            f"{where(d)} {d['config']} vs {d['baseline']} {stats.format_ratio(d)}" for d in unresolved))
    return lines


def split_rows(rows: list[dict]) -> tuple[list[dict], list[dict], dict, list[str]]:
    """(sweep rows, rollout rows, the meta row, configuration names in run order)."""
    sweep = [r for r in rows if r["workload"] == "sweep"]
    roll = [r for r in rows if r["workload"] == "rollout"]
    meta = next((r for r in rows if r["workload"] == "meta"), {})
    return sweep, roll, meta, meta.get("configs") or list(dict.fromkeys(r["config"] for r in sweep + roll))


def format_table(rows: list[dict]) -> str:
    """Batch size x config (tokens/s and speedup over vanilla with its paired 95% interval and
    half-width; each point marked where it cannot resolve 5%), dynamic's K histogram, ratios to
    the best static K, rollout, where speculation pays, which differences are real, and one line
    saying a quick run is a smoke run."""
    sweep, roll, meta, configs = split_rows(rows)
    s = summarize(rows)
    lines = ((_sweep_lines(sweep, configs, meta) if sweep else []) + _best_static_lines(sweep)
             + _decode_lines(sweep, configs) + _calibration_lines(sweep, configs) + _rollout_lines(roll, meta)
             + _learnt_lines(sweep + roll) + _summary_lines(s) + _differences_lines(s) + _quick_lines(meta))
    lines.append("lossless (greedy outputs identical to vanilla's): " + ("yes" if s["lossless"] else "NO")
                 + _divergence_text(sweep + roll))
    return "\n".join(lines)


def _divergence_text(rows: list[dict]) -> str:
    """After a "NO": how many requests diverged from vanilla, and whether every diagnosed
    divergence is a near-tie the programs' rounding can swap (`run.diagnose`)."""
    found = [d for r in rows for d in r.get("divergences", ())]
    if not found:
        return ""
    seen = [d for d in found if "near_tie" in d]
    wrong = [d for d in seen if not d["near_tie"]]
    text = f", {len(found)} request(s) diverged"
    if wrong:
        return text + f"; {len(wrong)} of the {len(seen)} diagnosed at a top-2 gap no rounding explains: a wrong token"
    if seen:
        widest = max(d["gap_in_ulps"] for d in seen)
        return (text + f"; all {len(seen)} diagnosed at near-ties the programs' rounding can swap "
                f"(top-2 gaps of at most {widest} ulps), each the argmax of a correct forward")
    return text


# --------------------------------------------------------------------------- files

def write_json(rows: list[dict], path: str | os.PathLike, env: dict | None = None) -> None:
    doc = {"schema": SCHEMA, "environment": env or environment(), "summary": summarize(rows), "rows": rows}
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(f):
        json.dump(doc, f, indent=1)
        f.write("\n")
    atomic_write(path, write)


def batch_axis(ax, sizes) -> None:
    """A log2 batch-size x axis labelled at the measured sizes."""
    from matplotlib.ticker import NullFormatter
    sizes = sorted(set(sizes))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("batch size")
    ax.grid(True, which="both", alpha=0.3)


def _line_style(c: str, colors: dict) -> dict:
    ls = "--" if c == "vanilla" else "-." if method_of(c) == "eagle3" else "-"
    return dict(color=colors[c], lw=2.6 if parse_config(c)[0] == "dynamic" else 1.4, ls=ls, marker="o", ms=4)


def _plot_throughput(ax, sweep, configs, colors) -> None:
    for c in configs:
        pts = sorted((r["batch_size"], r["tokens_per_s"]) for r in sweep if r["config"] == c)
        if pts:
            ax.plot(*zip(*pts), label=c, **_line_style(c, colors))
    batch_axis(ax, [r["batch_size"] for r in sweep])
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s (generated)")
    ax.set_title("throughput vs batch size")
    ax.legend(fontsize=8)


def _plot_speedup(ax, sweep, configs, colors) -> None:
    for c in configs:
        # the paired ratio (geometric mean over pairs), the centre of the bar drawn with it; the
        # ratio of medians can lie outside its own bar
        pts = sorted((r["batch_size"], _paired_or(r.get("vs_vanilla"), r["speedup_vs_vanilla"]))
                     for r in sweep if r["config"] == c)
        if pts:
            ax.plot(*zip(*pts), label=c, **_line_style(c, colors))
        cis = [(r["batch_size"], r["vs_vanilla"]) for r in sweep if r["config"] == c and c != "vanilla"
               and (r.get("vs_vanilla") or {}).get("lo") is not None]
        if cis:  # the paired 95% intervals
            ax.vlines([b for b, _ in cis], [x["lo"] for _, x in cis], [x["hi"] for _, x in cis],
                      color=colors[c], lw=4, alpha=0.35)
    ax.axhline(1.0, color="gray", lw=0.8)
    batch_axis(ax, [r["batch_size"] for r in sweep])
    ax.set_ylabel("speedup over vanilla")
    ax.set_title("speedup vs batch size (bars: paired 95% intervals)")


def _plot_rollout(ax, roll, configs, colors, meta) -> None:
    names = [c for c in configs if any(r["config"] == c for r in roll)]
    vals = [next(r["makespan_s"] for r in roll if r["config"] == c) for c in names]
    bars = ax.bar(range(len(names)), vals, color=[colors[c] for c in names])
    for bar, v in zip(bars, vals):
        ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("makespan (s)")
    n = meta.get("rollout") or {}
    ax.set_title(f"rollout of {n.get('num_requests', '')} heavy-tailed requests (mean of {n.get('units', 1)})")
    ax.grid(True, axis="y", alpha=0.3)


def config_colors(configs) -> dict:
    import matplotlib
    cmap = matplotlib.colormaps["tab10"]
    return {c: cmap(i % 10) for i, c in enumerate(configs)}


def check_plot_path(path: str | os.PathLike) -> None:
    """A ValueError unless matplotlib can write a figure to `path`, by its extension (checked
    before a run: `savefig` would fail only after it; without an extension it would append
    ".png" and write another file)."""
    from matplotlib.backend_bases import FigureCanvasBase  # the formats, without a pyplot backend

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    ext = os.path.splitext(os.fspath(path))[1][1:].lower()
    if ext not in formats:
        why = f"matplotlib cannot write {ext!r} files" if ext else "no file extension"
        raise ValueError(f"{os.fspath(path)!r}: {why}; give a file name ending in ." + ", .".join(formats))


def save_figure(fig, path: str | os.PathLike) -> None:
    fig.tight_layout()
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ext = os.path.splitext(path)[1][1:].lower()  # a file object carries no name to take the format from
    atomic_write(path, lambda f: fig.savefig(f, format=ext or None, dpi=110), "wb")


def write_plot(rows: list[dict], path: str | os.PathLike, title: str | None = None) -> None:
    """tokens/s vs batch size per configuration (log2 x) and the rollout makespan bars."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state is touched

    sweep, roll, meta, configs = split_rows(rows)
    ncols = max(2 * bool(sweep) + bool(roll), 1)
    fig = Figure(figsize=(5.2 * ncols, 4.2))
    axes = list(fig.subplots(1, ncols, squeeze=False)[0])
    colors = config_colors(configs)
    if sweep:
        _plot_throughput(axes.pop(0), sweep, configs, colors)
        _plot_speedup(axes.pop(0), sweep, configs, colors)
    if roll:
        _plot_rollout(axes.pop(0), roll, configs, colors, meta)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)
