"""The side-by-side comparison's analysis and report (`dsd_jax.bench.side_by_side`).

Lossless: engine outputs must equal vanilla's token for token; the floor and
hf-assisted are compared with vanilla too and their mismatches reported as measured
(float32 in XLA vs torch may break rare near-ties differently).

Predicted: the goodput model's speedup over vanilla from the run's own measurements:
ITL(B, K) = median step time at bucket B of the static-K runs (K = 0: vanilla's),
acceptance a_i pooled over the static runs, AL(K) = 1 + a_1 + ... + a_K, predicted
speedup of K = AL(K) * ITL(B, 0) / ITL(B, K); for dynamic the same over its K
histogram (sum of AL over sum of ITL). ``measured_over_predicted`` below 1 is time
the model does not see (prefill, host work, the first step, rows finishing early).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from dsd_jax import stats
from dsd_jax.acceptance import al_curve
from dsd_jax.bench.pairs import pair_groups, verdict_entry
from dsd_jax.bench.report import batch_axis, config_colors, format_hist, save_figure
from dsd_jax.bench.runner import median, mismatches
from dsd_jax.loading import atomic_write, json_safe


def is_engine(config: str) -> bool:
    return config not in ("floor", "hf-assisted")


# --------------------------------------------------------------------------- analysis

def _median_ms(step_ms, k: int, bucket: int) -> float | None:
    ms = [m for kk, bb, m, _ in step_ms if kk == k and bb == bucket]
    return median(ms) if ms else None


def _acceptance(cells: dict, max_k: int) -> list[float] | None:
    """a_1..a_max_k pooled over the static-K runs (None: none ran)."""
    totals = [c.total() for n, c in cells.items() if n.startswith("static-")]
    if not totals:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.sum([t["accepted"] for t in totals], axis=0) / np.sum([t["proposed"] for t in totals], axis=0)
    return [float(x) if np.isfinite(x) else 0.0 for x in a[:max_k]]


def goodput_prediction(cells: dict, b: int, max_k: int) -> dict:
    """ITL(B, K) and acceptance measured in this run, and the speedups the goodput model
    predicts from them (see the module docstring)."""
    itl = {0: _median_ms(cells["vanilla"].total()["step_ms"], 0, b)}
    for k in range(1, max_k + 1):
        if f"static-{k}" in cells:
            itl[k] = _median_ms(cells[f"static-{k}"].total()["step_ms"], k, b)
    a = _acceptance(cells, max_k)
    if a is None:
        return {"itl_ms": itl, "acceptance": None, "al": None, "speedup": {}}
    al = dict(enumerate(al_curve(np.asarray(a), max_k).tolist()))
    speedup = {f"static-{k}": al[k] * itl[0] / itl[k] for k in range(1, max_k + 1) if itl.get(k) and itl[0]}
    hist = cells["dynamic"].total()["k_hist"] if "dynamic" in cells else {}
    if hist and itl[0] and all(itl.get(k) for k in hist):
        steps = sum(hist.values())
        speedup["dynamic"] = (sum(n * al[k] for k, n in hist.items()) / steps) * itl[0] / (
            sum(n * itl[k] for k, n in hist.items()) / steps)
    return {"itl_ms": itl, "acceptance": a, "al": al, "speedup": speedup}


def _worst_mismatches(cell, ref) -> int:
    """The most requests differing from `ref`'s in one repeat, each repeat against the same
    repeat of `ref` (as `runner.point_row`): a later repeat may differ where the first did not."""
    return max(mismatches(outs, r) for outs, r in zip(cell.outputs, ref.outputs))


def _entry(c: str, cell, ref, floor, max_tokens: int) -> dict:
    """One configuration's entry; `ref`, `floor`: vanilla's and the floor's cells."""
    mism = _worst_mismatches(cell, ref)
    entry = {"tokens_per_s": median(cell.tokens_per_s()),
             "tokens_per_s_repeats": [round(x, 3) for x in cell.tokens_per_s()],
             "tokens_per_s_pairs": [round(x, 3) for x in cell.pairs], "vs_vanilla": None, "vs_floor": None,
             "tokens": cell.tokens[0],
             "all_max_tokens": all(len(o) == max_tokens for outs in cell.outputs for o in outs),
             "mismatched_requests_vs_vanilla": mism, "matches_floor": _worst_mismatches(cell, floor) == 0}
    if is_engine(c):
        total = cell.total()
        entry["lossless"] = mism == 0 and entry["all_max_tokens"]
        entry["k_hist"] = {str(k): v for k, v in sorted(total["k_hist"].items())}
        entry["mean_accepted_len"] = sum(cell.tokens) / total["row_steps"] if total["row_steps"] else None
    return entry


def analyse_point(cells: dict, b: int, max_tokens: int, max_k: int) -> dict:
    """One (max_seq_len, B): per configuration tokens/s, paired intervals, lossless, prediction."""
    samples = {c: cell.pairs for c, cell in cells.items()}
    # the repeats of one prompt group are one unit of the intervals (`dsd_jax.bench.pairs`)
    ref = cells["vanilla"]
    groups = pair_groups({"tokens_per_s_pairs": ref.pairs, "repeats": len(ref.walls)})
    vs_vanilla = stats.ratios_to(samples, "vanilla", clusters=groups)
    vs_floor = stats.ratios_to(samples, "floor", clusters=groups)
    pred = goodput_prediction(cells, b, max_k)
    out = {}
    for c, cell in cells.items():
        entry = _entry(c, cell, cells["vanilla"], cells["floor"], max_tokens)
        entry["vs_vanilla"], entry["vs_floor"] = vs_vanilla[c], vs_floor[c]
        if c == "hf-assisted":
            entry["sequential"] = b > 1
        if c in pred["speedup"]:
            entry["predicted_speedup"] = pred["speedup"][c]
            measured = (vs_vanilla[c] or {}).get("ratio")
            entry["measured_over_predicted"] = measured / pred["speedup"][c] if measured else None
        out[c] = entry
    return {"configs": out, "itl_ms": {str(k): v for k, v in pred["itl_ms"].items()},
            "acceptance": pred["acceptance"],
            "al": None if pred["al"] is None else {str(k): v for k, v in pred["al"].items()}}


def summarize(points: list[dict]) -> dict:
    """Lossless over the engine configurations, and every paired verdict (vs vanilla, vs floor)."""
    lossless = all(e["lossless"] for p in points for c, e in p["configs"].items() if is_engine(c))
    differences = [verdict_entry(e[f"vs_{base}"], max_seq_len=p["max_seq_len"], batch_size=p["batch_size"],
                                 config=c, baseline=base)
                   for p in points for c, e in p["configs"].items() for base in ("vanilla", "floor")
                   if c != base and e[f"vs_{base}"]]
    hf_mism = sum(p["configs"]["hf-assisted"]["mismatched_requests_vs_vanilla"] for p in points
                  if "hf-assisted" in p["configs"])
    return {"lossless": lossless, "hf_mismatched_requests": hf_mism, "differences": differences}


# --------------------------------------------------------------------------- report

def _config_line(c: str, e: dict) -> str:
    lossless = ("yes" if e["lossless"] else "NO") if "lossless" in e else (
        "ref" if c == "vanilla" else f"{e['mismatched_requests_vs_vanilla']} diff")
    if c == "floor" and e["mismatched_requests_vs_vanilla"] == 0:
        lossless = "same"
    pred, mop = e.get("predicted_speedup"), e.get("measured_over_predicted")
    return (f"  {c:<12} {e['tokens_per_s']:>9.1f}  {stats.format_ratio(e['vs_vanilla']):<30} "
            f"{stats.format_ratio(e['vs_floor']):<30} {lossless:>8}  "
            f"{f'{pred:.2f}x' if pred else '-':>9} {f'{mop:.2f}' if mop else '-':>9}  "
            + (format_hist(e["k_hist"]) if e.get("k_hist") and c == "dynamic" else "")
            + (" (B prompts one after another)" if e.get("sequential") else ""))


def _resolution_note(p: dict) -> str:
    """": cannot resolve 5%" where a comparison with vanilla has no interval or a half-width over 5%."""
    cis = [e["vs_vanilla"] for c, e in p["configs"].items() if c != "vanilla" and e["vs_vanilla"]]
    return "" if cis and all(map(stats.resolves, cis)) else ": cannot resolve 5%"


def format_table(doc: dict) -> str:
    s = doc["settings"]
    lines = [f"side by side: built-in pair, greedy, {s['max_tokens']} tokens per request, prompts <= "
             f"{s['prompt_len']} tokens, {s['repeats']} repeats; ratios are paired 95% intervals over "
             "prompt groups (none with one group), * = real (interval excludes 1), +- their half-width"]
    head = (f"  {'config':<12} {'tok/s':>9}  {'vs vanilla':<30} {'vs floor':<30} {'lossless':>8}  "
            f"{'predicted':>9} {'meas/pred':>9}  K histogram")
    for p in doc["points"]:
        lines.append(f"max_seq_len {p['max_seq_len']}, B={p['batch_size']} ({p['groups']} prompt group(s) of "
                     f"{p['batch_size']} per repeat)" + _resolution_note(p))
        lines.append(head)
        lines += [_config_line(c, e) for c, e in p["configs"].items()]
        if p.get("acceptance"):
            lines.append("  measured: acceptance a_i " + " ".join(f"{a:.2f}" for a in p["acceptance"])
                         + "; step ms by K " + " ".join(f"K{k}:{v:.2f}" for k, v in p["itl_ms"].items() if v))
        if p.get("skipped"):
            lines.append(f"  skipped: {p['skipped']}")
    summ = doc["summary"]
    real = [d for d in summ["differences"] if d["real"] and d["baseline"] == "vanilla"]
    lines.append("real differences from vanilla: " + ("; ".join(
        f"S={d['max_seq_len']} B={d['batch_size']} {d['config']} {d['verdict']} {stats.format_ratio(d)}"
        for d in real) if real else "none"))
    lines.append("lossless (engine configurations identical to vanilla's greedy tokens): "
                 + ("yes" if summ["lossless"] else "NO")
                 + f"; hf-assisted requests differing from vanilla: {summ['hf_mismatched_requests']}")
    return "\n".join(lines)


def _plot_seq_len(ax_tps, ax_ratio, pts: list[dict], configs: list[str], colors: dict) -> None:
    """tokens/s and speedup over vanilla (with paired intervals) vs B at one max_seq_len."""
    from matplotlib.ticker import FormatStrFormatter
    ratios = [e["vs_vanilla"]["ratio"] for p in pts for e in p["configs"].values() if e["vs_vanilla"]]
    for i, c in enumerate(configs):
        xs = [(p["batch_size"], p["configs"][c]) for p in pts if c in p["configs"]]
        if not xs:
            continue
        style = dict(color=colors[c], marker="o", ms=4, label=c, lw=2.4 if c == "dynamic" else 1.3,
                     ls="--" if c in ("floor", "vanilla") else "-")
        ax_tps.plot([b for b, _ in xs], [e["tokens_per_s"] for _, e in xs], **style)
        cis = [(b, e["vs_vanilla"]) for b, e in xs if e["vs_vanilla"]]
        ax_ratio.plot([b for b, _ in cis], [x["ratio"] for _, x in cis], **style)
        bars = [(b, x) for b, x in cis if x["lo"] is not None and c != "vanilla"]
        if bars:  # side by side around each batch size, so the bars do not hide each other
            shift = 2 ** (0.025 * (i - (len(configs) - 1) / 2))
            ax_ratio.vlines([b * shift for b, _ in bars], [x["lo"] for _, x in bars], [x["hi"] for _, x in bars],
                            color=colors[c], lw=4, alpha=0.35)
    for ax in (ax_tps, ax_ratio):
        batch_axis(ax, [p["batch_size"] for p in pts])
    ax_tps.set_yscale("log")
    ax_tps.set_ylabel("tokens/s (generated)")
    ax_tps.set_title(f"max_seq_len {pts[0]['max_seq_len']}")
    ax_ratio.axhline(1.0, color="gray", lw=0.8)
    ax_ratio.set_yscale("log")
    # the points decide the range: an interval from a few pairs may be far wider
    ax_ratio.set_ylim(min(ratios + [1.0]) / 1.25, max(ratios + [1.0]) * 1.25)
    ax_ratio.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))
    ax_ratio.yaxis.set_minor_formatter(FormatStrFormatter("%.2g"))
    ax_ratio.set_ylabel("speedup over vanilla (bars: paired 95% CI)")


def write_plot(doc: dict, path: str | os.PathLike) -> None:
    """Per max_seq_len: tokens/s vs B, and speedup over vanilla with its paired intervals."""
    from matplotlib.figure import Figure
    seq_lens = sorted({p["max_seq_len"] for p in doc["points"]})
    configs = list(dict.fromkeys(c for p in doc["points"] for c in p["configs"]))
    colors = config_colors(configs)
    fig = Figure(figsize=(5.2 * len(seq_lens), 8.0))
    axes = fig.subplots(2, len(seq_lens), squeeze=False)
    for j, s in enumerate(seq_lens):
        pts = sorted((p for p in doc["points"] if p["max_seq_len"] == s), key=lambda p: p["batch_size"])
        _plot_seq_len(axes[0][j], axes[1][j], pts, configs, colors)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("dsd-jax side by side: built-in pair, greedy")
    save_figure(fig, path)


def write_results(doc: dict, out: str | os.PathLike) -> None:
    """out/results.json and out/results.png, each written whole or not at all (`atomic_write`:
    a failed write leaves an earlier file as it was)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    def write(f):
        json.dump(json_safe(doc), f, indent=1, allow_nan=False)
        f.write("\n")
    atomic_write(out / "results.json", write)
    write_plot(doc, out / "results.png")
