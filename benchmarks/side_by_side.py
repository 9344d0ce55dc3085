"""Side by side, in one process: the floor of plain decoding in XLA, the engine (vanilla,
static K, dynamic K) and Hugging Face transformers' assisted generation, on the built-in
model pair, with paired confidence intervals and the goodput model's prediction.

    python benchmarks/side_by_side.py --out DIR [--batch-sizes 1,2,4,8] [--max-seq-lens 256,4096]
        [--max-tokens 128] [--repeats N] [--max-k 4] [--hf-batch-sizes 1] [--torch-threads N] [--quick]

(``--quick``: B = 1, 2 at max_seq_len 256, 12 tokens, K <= 2, 2 repeats; about 2 minutes
on 2 CPU cores, mostly compiling.)

Configurations, per (batch size B, engine max_seq_len S), all greedy, all generating
exactly ``max_tokens`` tokens for the same B held-out prompts:

- ``floor``: one jitted function of the same target weights, prefill with
  `models.forward` then a `lax.fori_loop` of one-token `models.forward` steps with
  argmax, its KV cache sized to the request (prompt + max_tokens), returning the tokens.
  No host loop, no slots, no scheduling: what plain decoding costs in XLA. It does not
  depend on S; it is run at every S so that it is paired with that S's runs.
- ``vanilla``: `SpecEngine` with ``SpecConfig(method="none")``.
- ``static-K`` (K = 1..max_k) and ``dynamic`` (the goodput controller, with a profile
  made by `dsd_jax.profiler.profile_engine` on this very engine): one draft-model
  engine whose controller is swapped between runs (`dsd_jax.bench`'s runner).
- ``hf-assisted``: ``transformers`` ``generate(..., assistant_model=draft,
  do_sample=False)`` with both models exported by `dsd_jax.models.save_hf`, torch on
  CPU, transformers' default assistant settings. Assisted generation takes one sequence
  at a time, so it runs only at the batch sizes in ``--hf-batch-sizes`` (default 1);
  for B > 1 the B prompts run one after another and are reported as such.

Method: every engine compiles all its programs (`warmup`) and runs every configuration
once untimed; the floor and hf-assisted are called once untimed per shape. Timed
runs: for each repeat, each B and each of its prompt groups (``rows_per_point``
prompts per point, in groups of B), every configuration runs once, in an order rotated
by one each time, so drift of the machine falls on all of them. A (repeat, group) is a
*pair unit*: tokens/s of two configurations on it are compared pair by pair and each
configuration's ratio to vanilla and to the floor carries a paired bootstrap 95%
interval (`dsd_jax.stats.paired_ratio`; a ``*`` marks an interval that excludes 1).
tokens/s = generated tokens / wall time of the call (prefill included).

Lossless: engine outputs must equal vanilla's token for token (exit status 1 if not);
the floor and hf-assisted are compared with vanilla too and their mismatches reported
as measured (float32 in XLA vs torch may break rare near-ties differently).

Predicted: the goodput model's speedup over vanilla from this run's own measurements:
ITL(B, K) = median step time at bucket B of the static-K runs (K = 0: vanilla's),
acceptance a_i pooled over the static runs, AL(K) = 1 + a_1 + ... + a_K, predicted
speedup of K = AL(K) * ITL(B, 0) / ITL(B, K); for dynamic the same over its K
histogram (sum of AL over sum of ITL). ``measured_over_predicted`` below 1 is time
the model does not see (prefill, host work, the first step, rows finishing early).

Output: DIR/results.json, DIR/results.png and a table on stdout.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax import bench, models, stats
from dsd_jax.sampling import SamplingParams

FULL = dict(batch_sizes=(1, 2, 4, 8), max_seq_lens=(256, 4096), max_tokens=128, repeats=5, max_k=4,
            prompt_len=64, rows_per_point=4, hf_batch_sizes=(1,), torch_threads=None, profile_repeats=7,
            profile_prompts=8)
# --quick: a smoke test of the whole pipeline (seconds of timed runs; compiling dominates)
QUICK = dict(batch_sizes=(1, 2), max_seq_lens=(256,), max_tokens=12, repeats=2, max_k=2,
             prompt_len=32, rows_per_point=2, hf_batch_sizes=(1,), torch_threads=None, profile_repeats=3,
             profile_prompts=2)
ENGINE_KINDS = ("vanilla", "static", "dynamic")


def config_names(max_k: int, hf: bool = True) -> list[str]:
    return (["floor", "vanilla"] + [f"static-{k}" for k in range(1, max_k + 1)] + ["dynamic"]
            + (["hf-assisted"] if hf else []))


def is_engine(config: str) -> bool:
    return config not in ("floor", "hf-assisted")


# --------------------------------------------------------------------------- the floor

def make_floor(model, pad_to: int) -> Callable:
    """``run(prompts, max_tokens) -> tokens``: plain greedy decoding of `model` as one XLA
    program. Prompts are right-padded to `pad_to` tokens, so the program is compiled once
    per (batch size, max_tokens), on the first (untimed) call."""
    graphdef, params = nnx.split(model)
    cfg = model.config

    @functools.partial(jax.jit, static_argnums=(3,))
    def decode(params, tokens, lengths, max_tokens):
        B, P = tokens.shape
        kv = models.init_kv_cache(cfg, B, P + max_tokens)
        cols = jnp.arange(P, dtype=jnp.int32)[None]
        logits, kv = models.forward(graphdef, params, tokens, jnp.where(cols < lengths[:, None], cols, -1), kv)
        first = jnp.argmax(logits[jnp.arange(B), lengths - 1], axis=-1).astype(jnp.int32)
        out = jnp.zeros((B, max_tokens), jnp.int32).at[:, 0].set(first)

        def step(t, carry):  # token t - 1 sits at position length + t - 1 and yields token t
            kv, tok, out = carry
            logits, kv = models.forward(graphdef, params, tok[:, None], (lengths + t - 1)[:, None], kv)
            tok = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
            return kv, tok, out.at[:, t].set(tok)

        return jax.lax.fori_loop(1, max_tokens, step, (kv, first, out))[2]

    def run(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        tokens = np.zeros((len(prompts), pad_to), np.int32)
        for i, p in enumerate(prompts):
            tokens[i, :len(p)] = p
        lengths = np.array([len(p) for p in prompts], np.int32)
        return np.asarray(jax.block_until_ready(decode(params, tokens, lengths, max_tokens))).tolist()

    return run


# --------------------------------------------------------------------------- transformers

class HFAssisted:
    """The pair exported with `save_hf` and loaded by transformers (torch, CPU, float32)."""

    def __init__(self, target, draft, workdir: str, threads: int | None = None):
        import torch
        import transformers
        transformers.logging.set_verbosity_error()
        if threads:  # on a busy machine torch's default thread pool can spin-wait for 100x longer
            torch.set_num_threads(int(threads))
        self.torch = torch
        loaded = []
        for name, model in (("target", target), ("draft", draft)):
            path = models.save_hf(model, os.path.join(workdir, name))
            loaded.append(transformers.AutoModelForCausalLM.from_pretrained(path).float().eval())
        self.target, self.draft = loaded
        self.info = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                     "torch_threads": torch.get_num_threads(), "device": "cpu",
                     "assistant": "transformers defaults (num_assistant_tokens, schedule)"}

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """One prompt at a time: transformers' assisted generation does not batch."""
        torch, outs = self.torch, []
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p], dtype=torch.long)
                out = self.target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=self.draft,
                                           do_sample=False, max_new_tokens=max_tokens, pad_token_id=0)
                outs.append(out[0, len(p):].tolist())
        return outs


# --------------------------------------------------------------------------- measuring

class Cell:
    """Every timed run of one configuration at one (max_seq_len, B)."""

    def __init__(self):
        self.pairs: list[float] = []  # tokens/s per (repeat, group), in run order
        self.repeat_tokens: dict[int, int] = collections.Counter()
        self.repeat_wall: dict[int, float] = collections.Counter()
        self.outputs: list[list[int]] = []  # the first repeat's, group after group
        self.step_ms: list[tuple] = []  # (K, bucket, ms) of engine steps after the first
        self.k_hist: collections.Counter = collections.Counter()
        self.accepted = self.proposed = None  # per draft position, summed over runs
        self.row_steps = 0

    def add(self, rep: int, wall: float, outs: list[list[int]], info: dict | None) -> None:
        tokens = sum(len(o) for o in outs)
        self.pairs.append(tokens / wall)
        self.repeat_tokens[rep] += tokens
        self.repeat_wall[rep] += wall
        if rep == 0:
            self.outputs += outs
        if info:
            self.step_ms += info["step_ms"]
            self.k_hist.update({int(k): v for k, v in info["k_hist"].items()})
            self.row_steps += info["row_steps"]
            if "accepted" in info:
                acc, prop = np.asarray(info["accepted"]), np.asarray(info["proposed"])
                self.accepted = acc if self.accepted is None else self.accepted + acc
                self.proposed = prop if self.proposed is None else self.proposed + prop


def _engine_run(runner, config: str, prompts, max_tokens: int):
    """`bench._Runner.run` plus the run's acceptance counts per draft position."""
    wall, outs, info = runner.run(config, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    if config != "vanilla":
        st = runner.spec.stats
        info = {**info, "accepted": st.accepted_per_pos.copy(), "proposed": st.proposed_per_pos.copy()}
    return wall, outs, info


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def _groups(prompts: list[list[int]], b: int, rows_per_point: int) -> list[list[list[int]]]:
    """ceil(rows_per_point / b) groups of b prompts (cycling through `prompts`)."""
    n = max(1, -(-rows_per_point // b))
    return [[prompts[(g * b + i) % len(prompts)] for i in range(b)] for g in range(n)]


def measure_seq_len(target, draft, prompts, profile_prompts, *, max_seq_len: int, batch_sizes: Sequence[int],
                    max_tokens: int, repeats: int, max_k: int, rows_per_point: int, hf: HFAssisted | None,
                    hf_batch_sizes: Sequence[int], floor: Callable, profile_repeats: int,
                    compilation_cache_dir: str | None, log: Callable) -> dict:
    """All configurations at one engine max_seq_len: {B: {config: Cell}} plus timings."""
    from dsd_jax.profiler import profile_engine
    t_start = time.perf_counter()
    engine_configs = [c for c in config_names(max_k, hf=False) if is_engine(c)]
    prompt_len = max(len(p) for p in prompts)
    runner = bench._Runner(target, draft, None, configs=engine_configs, max_batch_size=max(batch_sizes),
                           max_seq_len=max_seq_len, max_k=max_k, batch_buckets=list(batch_sizes),
                           prefill_chunk=min(256, 1 << max(4, (prompt_len - 1).bit_length())),
                           compilation_cache_dir=compilation_cache_dir, log=log)
    log(f"max_seq_len {max_seq_len}: compiling the engines ...")
    runner.warmup()
    ctx = min(max_seq_len, prompt_len + max_tokens // 2)
    log(f"  profiling the draft-model engine (context {ctx}) for the dynamic controller ...")
    runner.profile = profile_engine(runner.spec, context_lengths=(ctx,), repeats=profile_repeats, warmup_reps=2,
                                    prompts=profile_prompts, acceptance_max_tokens=min(max_tokens, 64),
                                    temperatures=(0.0,))
    setup_s = time.perf_counter() - t_start

    def run(config: str, group):
        if config == "floor":
            wall, outs = _timed(floor, group, max_tokens)
            return wall, outs, None
        if config == "hf-assisted":
            wall, outs = _timed(hf.generate, group, max_tokens)
            return wall, outs, None
        return _engine_run(runner, config, group, max_tokens)

    plan = {b: [c for c in config_names(max_k, hf is not None)
                if c != "hf-assisted" or b in hf_batch_sizes] for b in batch_sizes}
    # untimed: every configuration at every batch size once (compiles the floor per shape,
    # takes the engines through their buckets, warms torch)
    for b in batch_sizes:
        for c in plan[b]:
            run(c, _groups(prompts, b, b)[0])
    cells = {b: {c: Cell() for c in plan[b]} for b in batch_sizes}
    rotation = 0
    t0 = time.perf_counter()
    for rep in range(repeats):
        for b in batch_sizes:
            for group in _groups(prompts, b, rows_per_point):
                order = plan[b][rotation % len(plan[b]):] + plan[b][:rotation % len(plan[b])]
                rotation += 1
                for c in order:
                    cells[b][c].add(rep, *run(c, group))
            log(f"  [repeat {rep + 1}/{repeats}] S={max_seq_len} B={b}: " + ", ".join(
                f"{c} {cells[b][c].repeat_tokens[rep] / cells[b][c].repeat_wall[rep]:.0f}" for c in plan[b])
                + " tok/s")
    profile = runner.profile
    del runner
    gc.collect()
    return {"cells": cells, "profile_acceptance": list(profile.acceptance),
            "seconds": {"setup": round(setup_s, 2), "timed": round(time.perf_counter() - t0, 2)}}


# --------------------------------------------------------------------------- analysis

def _median_ms(step_ms, k: int, bucket: int) -> float | None:
    ms = [m for kk, bb, m in step_ms if kk == k and bb == bucket]
    return float(statistics.median(ms)) if ms else None


def goodput_prediction(cells: dict, b: int, max_k: int) -> dict:
    """ITL(B, K) and acceptance measured in this run, and the speedups the goodput model
    predicts from them (see the module docstring)."""
    itl = {0: _median_ms(cells["vanilla"].step_ms, 0, b)}
    for k in range(1, max_k + 1):
        if f"static-{k}" in cells:
            itl[k] = _median_ms(cells[f"static-{k}"].step_ms, k, b)
    acc = [c.accepted for n, c in cells.items() if n.startswith("static-") and c.accepted is not None]
    prop = [c.proposed for n, c in cells.items() if n.startswith("static-") and c.proposed is not None]
    if not acc:
        return {"itl_ms": itl, "acceptance": None, "al": None, "speedup": {}}
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.sum(acc, axis=0) / np.sum(prop, axis=0)
    a = [float(x) if np.isfinite(x) else 0.0 for x in a[:max_k]]
    al = {k: 1.0 + sum(a[:k]) for k in range(max_k + 1)}
    speedup = {}
    for k in range(1, max_k + 1):
        if itl.get(k) and itl[0]:
            speedup[f"static-{k}"] = al[k] * itl[0] / itl[k]
    hist = cells["dynamic"].k_hist if "dynamic" in cells else {}
    if hist and itl[0] and all(itl.get(k) for k in hist):
        steps = sum(hist.values())
        speedup["dynamic"] = (sum(n * al[k] for k, n in hist.items()) / steps) * itl[0] / (
            sum(n * itl[k] for k, n in hist.items()) / steps)
    return {"itl_ms": itl, "acceptance": a, "al": al, "speedup": speedup}


def _mismatches(outs, ref) -> int:
    return sum(o != r for o, r in zip(outs, ref)) + abs(len(outs) - len(ref))


def analyse_point(cells: dict, b: int, max_tokens: int, max_k: int) -> dict:
    """One (max_seq_len, B): per configuration tokens/s, paired intervals, lossless, prediction."""
    samples = {c: cell.pairs for c, cell in cells.items()}
    vs_vanilla, vs_floor = stats.ratios_to(samples, "vanilla"), stats.ratios_to(samples, "floor")
    pred = goodput_prediction(cells, b, max_k)
    ref, floor_out = cells["vanilla"].outputs, cells["floor"].outputs
    out = {}
    for c, cell in cells.items():
        reps = sorted(cell.repeat_wall)
        tps = [cell.repeat_tokens[r] / cell.repeat_wall[r] for r in reps]
        mism = _mismatches(cell.outputs, ref)
        entry = {"tokens_per_s": float(statistics.median(tps)),
                 "tokens_per_s_repeats": [round(x, 3) for x in tps],
                 "tokens_per_s_pairs": [round(x, 3) for x in cell.pairs],
                 "vs_vanilla": vs_vanilla[c], "vs_floor": vs_floor[c],
                 "tokens": cell.repeat_tokens[reps[0]],
                 "all_max_tokens": all(len(o) == max_tokens for o in cell.outputs),
                 "mismatched_requests_vs_vanilla": mism,
                 "matches_floor": _mismatches(cell.outputs, floor_out) == 0}
        if is_engine(c):
            entry["lossless"] = mism == 0 and entry["all_max_tokens"]
            entry["k_hist"] = {str(k): v for k, v in sorted(cell.k_hist.items())}
            entry["mean_accepted_len"] = (sum(cell.repeat_tokens.values()) / cell.row_steps
                                          if cell.row_steps else None)
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
    differences = []
    for p in points:
        for c, e in p["configs"].items():
            for base in ("vanilla", "floor"):
                res = e[f"vs_{base}"]
                if c != base and res:
                    differences.append({"max_seq_len": p["max_seq_len"], "batch_size": p["batch_size"],
                                        "config": c, "baseline": base, **res, "real": stats.is_real(res),
                                        "verdict": stats.verdict(res), "resolution": stats.resolution(res)})
    hf_mism = sum(p["configs"]["hf-assisted"]["mismatched_requests_vs_vanilla"] for p in points
                  if "hf-assisted" in p["configs"])
    return {"lossless": lossless, "hf_mismatched_requests": hf_mism, "differences": differences}


# --------------------------------------------------------------------------- reporting

def format_table(doc: dict) -> str:
    s = doc["settings"]
    lines = [f"side by side: built-in pair, greedy, {s['max_tokens']} tokens per request, prompts <= "
             f"{s['prompt_len']} tokens, {s['repeats']} repeats; ratios are paired 95% intervals, * = real "
             "(interval excludes 1)"]
    head = (f"  {'config':<12} {'tok/s':>9}  {'vs vanilla':<22} {'vs floor':<22} {'lossless':>8}  "
            f"{'predicted':>9} {'meas/pred':>9}  K histogram")
    for p in doc["points"]:
        groups = p["groups"]
        lines.append(f"max_seq_len {p['max_seq_len']}, B={p['batch_size']} ({groups} prompt group(s) of "
                     f"{p['batch_size']} per repeat)")
        lines.append(head)
        for c, e in p["configs"].items():
            lossless = ("yes" if e["lossless"] else "NO") if "lossless" in e else (
                "ref" if c == "vanilla" else f"{e['mismatched_requests_vs_vanilla']} diff")
            if c == "floor" and e["mismatched_requests_vs_vanilla"] == 0:
                lossless = "same"
            pred = e.get("predicted_speedup")
            mop = e.get("measured_over_predicted")
            lines.append(f"  {c:<12} {e['tokens_per_s']:>9.1f}  {stats.format_ratio(e['vs_vanilla']):<22} "
                         f"{stats.format_ratio(e['vs_floor']):<22} {lossless:>8}  "
                         f"{f'{pred:.2f}x' if pred else '-':>9} {f'{mop:.2f}' if mop else '-':>9}  "
                         + (bench._fmt_hist(e["k_hist"]) if e.get("k_hist") and c == "dynamic" else "")
                         + (" (B prompts one after another)" if e.get("sequential") else ""))
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


def write_plot(doc: dict, path: str | os.PathLike) -> None:
    """Per max_seq_len: tokens/s vs B, and speedup over vanilla with its paired intervals."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    seq_lens = sorted({p["max_seq_len"] for p in doc["points"]})
    configs = list(dict.fromkeys(c for p in doc["points"] for c in p["configs"]))
    cmap = matplotlib.colormaps["tab10"]
    colors = {c: cmap(i % 10) for i, c in enumerate(configs)}
    fig = Figure(figsize=(5.2 * len(seq_lens), 8.0))
    axes = fig.subplots(2, len(seq_lens), squeeze=False)
    for j, s in enumerate(seq_lens):
        pts = sorted((p for p in doc["points"] if p["max_seq_len"] == s), key=lambda p: p["batch_size"])
        ratios = [e["vs_vanilla"]["ratio"] for p in pts for e in p["configs"].values() if e["vs_vanilla"]]
        for i, c in enumerate(configs):
            xs = [(p["batch_size"], p["configs"][c]) for p in pts if c in p["configs"]]
            if not xs:
                continue
            style = dict(color=colors[c], marker="o", ms=4, label=c, lw=2.4 if c == "dynamic" else 1.3,
                         ls="--" if c in ("floor", "vanilla") else "-")
            axes[0][j].plot([b for b, _ in xs], [e["tokens_per_s"] for _, e in xs], **style)
            cis = [(b, e["vs_vanilla"]) for b, e in xs if e["vs_vanilla"]]
            axes[1][j].plot([b for b, _ in cis], [x["ratio"] for _, x in cis], **style)
            bars = [(b, x) for b, x in cis if x["lo"] is not None and c != "vanilla"]
            if bars:  # side by side around each batch size, so the bars do not hide each other
                shift = 2 ** (0.025 * (i - (len(configs) - 1) / 2))
                axes[1][j].vlines([b * shift for b, _ in bars], [x["lo"] for _, x in bars], [x["hi"] for _, x in bars],
                                  color=colors[c], lw=4, alpha=0.35)
        for i, ax in enumerate(axes[:, j]):
            ax.set_xscale("log", base=2)
            sizes = [p["batch_size"] for p in pts]
            ax.set_xticks(sizes, [str(b) for b in sizes])
            ax.set_xlabel("batch size")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][j].set_yscale("log")
        axes[0][j].set_ylabel("tokens/s (generated)")
        axes[0][j].set_title(f"max_seq_len {s}")
        axes[1][j].axhline(1.0, color="gray", lw=0.8)
        axes[1][j].set_yscale("log")
        # the points decide the range: an interval from a few pairs may be far wider
        axes[1][j].set_ylim(min(ratios + [1.0]) / 1.25, max(ratios + [1.0]) * 1.25)
        axes[1][j].yaxis.set_major_formatter(FormatStrFormatter("%.2g"))
        axes[1][j].yaxis.set_minor_formatter(FormatStrFormatter("%.2g"))
        axes[1][j].set_ylabel("speedup over vanilla (bars: paired 95% CI)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("dsd-jax side by side: built-in pair, greedy")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)


# --------------------------------------------------------------------------- entry points

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (results.json, results.png)")
    ap.add_argument("--batch-sizes", help="comma-separated batch sizes (default 1,2,4,8)")
    ap.add_argument("--max-seq-lens", help="comma-separated engine max_seq_len values (default 256,4096)")
    ap.add_argument("--max-tokens", type=int, help="tokens generated per request (default 128)")
    ap.add_argument("--repeats", type=int, help="timed repeats (default 5)")
    ap.add_argument("--max-k", type=int, help="static-K for K = 1..max_k, dynamic up to max_k (default 4)")
    ap.add_argument("--prompt-len", type=int, help="prompt tokens kept per held-out prompt (default 64)")
    ap.add_argument("--rows-per-point", type=int,
                    help="prompts per (B, max_seq_len) and repeat, run in groups of B (default 4)")
    ap.add_argument("--hf-batch-sizes", help="batch sizes at which hf-assisted runs (default 1; "
                    "'none' skips it); B > 1 runs its prompts one after another")
    ap.add_argument("--torch-threads", type=int, help="torch CPU threads for hf-assisted (default: torch's)")
    ap.add_argument("--compilation-cache-dir", help="persistent XLA compilation cache")
    ap.add_argument("--quick", action="store_true", help="tiny settings: a smoke test of the pipeline")
    return ap.parse_args(argv)


def settings_from(args) -> dict:
    d = dict(QUICK if args.quick else FULL)
    for key in ("max_tokens", "repeats", "max_k", "prompt_len", "rows_per_point", "torch_threads"):
        v = getattr(args, key, None)
        if v is not None:
            d[key] = int(v)
    for key in ("batch_sizes", "max_seq_lens"):
        if getattr(args, key, None):
            d[key] = bench._int_list(key, getattr(args, key))
    if args.hf_batch_sizes:
        d["hf_batch_sizes"] = [] if args.hf_batch_sizes.strip() == "none" else bench._int_list(
            "hf_batch_sizes", args.hf_batch_sizes)
    d["batch_sizes"] = sorted(d["batch_sizes"])
    d["max_seq_lens"] = sorted(d["max_seq_lens"])
    if min(d["max_tokens"], d["repeats"], d["max_k"], d["prompt_len"], d["rows_per_point"]) < 1:
        raise SystemExit("--max-tokens, --repeats, --max-k, --prompt-len and --rows-per-point must be >= 1")
    if d["prompt_len"] + d["max_tokens"] > d["max_seq_lens"][0]:
        raise SystemExit(f"prompt_len {d['prompt_len']} + max_tokens {d['max_tokens']} do not fit in "
                         f"max_seq_len {d['max_seq_lens'][0]}")
    return d


def run(target, draft, prompts: list[list[int]], profile_prompts: list[list[int]], settings: dict, *,
        hf: bool = True, compilation_cache_dir: str | None = None, log: Callable = print) -> dict:
    """The whole comparison for token-id prompts; returns the results document."""
    t_start = time.perf_counter()
    s = settings
    prompts = [p[:s["prompt_len"]] for p in prompts]
    profile_prompts = [p[:s["prompt_len"]] for p in profile_prompts]
    floor = make_floor(target, max(len(p) for p in prompts))
    hf_batch = [b for b in s["hf_batch_sizes"] if b in s["batch_sizes"]] if hf else []
    points, seconds = [], {}
    with tempfile.TemporaryDirectory(prefix="dsd_side_by_side_") as tmp:
        hf_pair = HFAssisted(target, draft, tmp, s.get("torch_threads")) if hf_batch else None
        for seq in s["max_seq_lens"]:
            m = measure_seq_len(target, draft, prompts, profile_prompts, max_seq_len=seq,
                                batch_sizes=s["batch_sizes"], max_tokens=s["max_tokens"], repeats=s["repeats"],
                                max_k=s["max_k"], rows_per_point=s["rows_per_point"], hf=hf_pair,
                                hf_batch_sizes=hf_batch, floor=floor, profile_repeats=s["profile_repeats"],
                                compilation_cache_dir=compilation_cache_dir, log=log)
            seconds[str(seq)] = m["seconds"]
            for b, cells in m["cells"].items():
                point = {"max_seq_len": seq, "batch_size": b,
                         "groups": len(_groups(prompts, b, s["rows_per_point"])),
                         **analyse_point(cells, b, s["max_tokens"], s["max_k"]),
                         "profile_acceptance": m["profile_acceptance"]}
                if hf and b not in hf_batch:
                    point["skipped"] = ("hf-assisted (transformers' assisted generation takes one sequence at "
                                        "a time; add B to --hf-batch-sizes to run the prompts sequentially)")
                points.append(point)
        hf_info = hf_pair.info if hf_pair else None
    env = bench.environment()
    doc = {"schema": "dsd_jax.side_by_side/1", "environment": env, "settings": {**s, "hf_batch_sizes": hf_batch},
           "hf": hf_info, "points": points, "summary": summarize(points),
           "seconds": {"per_max_seq_len": seconds, "total": round(time.perf_counter() - t_start, 2)}}
    return doc


def builtin_prompts(n: int, n_profile: int, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """Held-out prompts as token ids: n for the benchmark, n_profile disjoint ones for profiling."""
    texts = models.heldout_prompts(n + n_profile)
    ids = [tokenizer.encode(t).ids for t in texts]
    return ids[:n], ids[n:]


def main(argv=None, log: Callable = print) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is an existing file, not a directory")
    s = settings_from(args)
    target, draft, tokenizer = models.builtin()
    n = max(s["rows_per_point"], max(s["batch_sizes"]))
    prompts, profile_prompts = builtin_prompts(n, s["profile_prompts"], tokenizer)
    doc = run(target, draft, prompts, profile_prompts, s, hf=bool(s["hf_batch_sizes"]),
              compilation_cache_dir=args.compilation_cache_dir, log=log)
    doc["models"] = "built-in pair (dsd_jax.models.builtin)"
    write_results(doc, out)
    log(format_table(doc))
    log(f"wrote {out / 'results.json'} and {out / 'results.png'}")
    return doc


def write_results(doc: dict, out: str | os.PathLike) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    write_plot(doc, out / "results.png")


if __name__ == "__main__":
    sys.exit(0 if main()["summary"]["lossless"] else 1)
