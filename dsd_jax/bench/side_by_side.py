"""Side by side, in one process: the floor of plain decoding in XLA, the engine (vanilla,
static K, dynamic K) and Hugging Face transformers' assisted generation, on one model
pair, with paired confidence intervals and the goodput model's prediction.
`benchmarks/side_by_side.py` runs it on the built-in pair.

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
  engine whose controller is swapped between runs (`dsd_jax.bench.runner.Runner`).
- ``hf-assisted``: ``transformers`` ``generate(..., assistant_model=draft,
  do_sample=False)`` with both models exported by `dsd_jax.models.save_hf`, torch on
  CPU, transformers' default assistant settings. Assisted generation takes one sequence
  at a time, so it runs only at the batch sizes in ``hf_batch_sizes`` (default 1);
  for B > 1 the B prompts run one after another and are reported as such.

Method: every engine compiles all its programs (`warmup`) and runs every configuration
once untimed; the floor and hf-assisted are called once untimed per shape. Timed runs
are the bench's interleaved repeats (`dsd_jax.bench.runner.run_interleaved`):
``rows_per_point`` prompts per point in groups of B, every (repeat, group) a pair
unit; each configuration's ratio to vanilla and to the floor carries a paired 95%
interval over the prompt groups (`dsd_jax.bench.pairs`; none where B >= rows_per_point
leaves one group). tokens/s = generated tokens / wall time of the call (prefill included).
Lossless, the prediction and the report: `dsd_jax.bench.side_by_side_report`.
"""

from __future__ import annotations

import functools
import gc
import os
import tempfile
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax import models
from dsd_jax.bench.environment import environment
from dsd_jax.bench.runner import Runner, run_interleaved
from dsd_jax.bench.settings import int_list, prefill_chunk_for
from dsd_jax.bench.side_by_side_report import analyse_point, format_table, is_engine, summarize, write_results
from dsd_jax.bench.workloads import Point, check_distinct_groups, group_count, prompt_groups, sweep_prompts
from dsd_jax.sampling import SamplingParams

__all__ = ["FULL", "QUICK", "config_names", "is_engine", "make_settings", "make_floor", "HFAssisted", "run",
           "run_builtin", "format_table", "write_results"]

FULL = dict(batch_sizes=(1, 2, 4, 8), max_seq_lens=(256, 4096), max_tokens=128, repeats=5, max_k=4,
            prompt_len=64, rows_per_point=4, hf_batch_sizes=(1,), torch_threads=None, profile_repeats=7,
            profile_prompts=8)
# quick: a smoke test of the whole pipeline (seconds of timed runs; compiling dominates)
QUICK = dict(batch_sizes=(1, 2), max_seq_lens=(256,), max_tokens=12, repeats=2, max_k=2,
             prompt_len=32, rows_per_point=2, hf_batch_sizes=(1,), torch_threads=None, profile_repeats=3,
             profile_prompts=2)


def config_names(max_k: int, hf: bool = True) -> list[str]:
    return (["floor", "vanilla"] + [f"static-{k}" for k in range(1, max_k + 1)] + ["dynamic"]
            + (["hf-assisted"] if hf else []))


def make_settings(quick: bool = False, **overrides) -> dict:
    """The mode's settings with `overrides` (None: keep the default), validated (ValueError).
    Lists may be comma-separated strings; hf_batch_sizes "none" runs no hf-assisted."""
    d = dict(QUICK if quick else FULL)
    d.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("max_tokens", "repeats", "max_k", "prompt_len", "rows_per_point"):
        d[key] = int(d[key])
    for key in ("batch_sizes", "max_seq_lens"):
        d[key] = int_list(key, d[key])
    hf = d["hf_batch_sizes"]
    d["hf_batch_sizes"] = [] if isinstance(hf, str) and hf.strip() == "none" else int_list("hf_batch_sizes", hf)
    if min(d["max_tokens"], d["repeats"], d["max_k"], d["prompt_len"], d["rows_per_point"]) < 1:
        raise ValueError("--max-tokens, --repeats, --max-k, --prompt-len and --rows-per-point must be >= 1")
    if d["prompt_len"] + d["max_tokens"] > d["max_seq_lens"][0]:
        raise ValueError(f"prompt_len {d['prompt_len']} + max_tokens {d['max_tokens']} do not fit in "
                         f"max_seq_len {d['max_seq_lens'][0]}")
    return d


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

def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out, None


def _profiled_runner(target, draft, prompts, profile_prompts, *, max_seq_len: int, batch_sizes, max_tokens: int,
                     max_k: int, profile_repeats: int, compilation_cache_dir, log) -> Runner:
    """The bench's runner for every engine configuration, compiled, with a profile of its
    draft-model engine for the dynamic controller."""
    from dsd_jax.profiler import profile_engine
    prompt_len = max(len(p) for p in prompts)
    runner = Runner(target, draft, None, configs=[c for c in config_names(max_k, hf=False) if is_engine(c)],
                    max_batch_size=max(batch_sizes), max_seq_len=max_seq_len, max_k=max_k,
                    batch_buckets=list(batch_sizes), prefill_chunk=prefill_chunk_for(prompt_len),
                    compilation_cache_dir=compilation_cache_dir, log=log)
    log(f"max_seq_len {max_seq_len}: compiling the engines ...")
    runner.warmup()
    ctx = min(max_seq_len, prompt_len + max_tokens // 2)
    log(f"  profiling the draft-model engine (context {ctx}) for the dynamic controller ...")
    runner.profiles["draft_model"] = profile_engine(runner.spec, context_lengths=(ctx,), repeats=profile_repeats,
                                                    warmup_reps=2, prompts=profile_prompts,
                                                    acceptance_max_tokens=min(max_tokens, 64), temperatures=(0.0,))
    return runner


def measure_seq_len(target, draft, prompts, profile_prompts, *, max_seq_len: int, batch_sizes: Sequence[int],
                    max_tokens: int, repeats: int, max_k: int, rows_per_point: int, hf: HFAssisted | None,
                    hf_batch_sizes: Sequence[int], floor: Callable, profile_repeats: int,
                    compilation_cache_dir: str | None, log: Callable) -> dict:
    """All configurations at one engine max_seq_len: {B: {config: Cell}} plus timings."""
    t_start = time.perf_counter()
    runner = _profiled_runner(target, draft, prompts, profile_prompts, max_seq_len=max_seq_len,
                              batch_sizes=batch_sizes, max_tokens=max_tokens, max_k=max_k,
                              profile_repeats=profile_repeats, compilation_cache_dir=compilation_cache_dir, log=log)
    setup_s = time.perf_counter() - t_start
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)  # fixed lengths
    points = [Point("side-by-side", b, prompt_groups(prompts, b, group_count(b, rows_per_point)),
                    [c for c in config_names(max_k, hf is not None) if c != "hf-assisted" or b in hf_batch_sizes],
                    greedy) for b in batch_sizes]

    def run(config: str, point: Point, u: int):
        group = point.units[u]
        if config == "floor":
            return _timed(floor, group, max_tokens)
        if config == "hf-assisted":
            return _timed(hf.generate, group, max_tokens)
        return runner.run(config, group, point.sampling)

    # untimed: every configuration at every batch size once (compiles the floor per shape,
    # takes the engines through their buckets, warms torch)
    for p in points:
        for c in p.configs:
            run(c, p, 0)
    t0 = time.perf_counter()
    run_interleaved(points, run, repeats, on_repeat=lambda rep, p: log(
        f"  [repeat {rep + 1}/{repeats}] S={max_seq_len} B={p.batch_size}: " + ", ".join(
            f"{c} {p.cells[c].tokens[rep] / p.cells[c].walls[rep]:.0f}" for c in p.configs) + " tok/s"))
    acceptance = list(runner.profiles["draft_model"].acceptance)
    del runner
    gc.collect()
    return {"cells": {p.batch_size: p.cells for p in points}, "profile_acceptance": acceptance,
            "seconds": {"setup": round(setup_s, 2), "timed": round(time.perf_counter() - t0, 2)}}


# --------------------------------------------------------------------------- the comparison

HF_SKIPPED = ("hf-assisted (transformers' assisted generation takes one sequence at a time; add B to "
              "--hf-batch-sizes to run the prompts sequentially)")


def run(target, draft, prompts: list[list[int]], profile_prompts: list[list[int]], settings: dict, *,
        hf: bool = True, compilation_cache_dir: str | None = None, log: Callable = print) -> dict:
    """The whole comparison for token-id prompts; returns the results document. Too few
    prompts for every point's groups to be distinct is a ValueError (`check_distinct_groups`)."""
    t_start = time.perf_counter()
    s = settings
    # the intervals resample prompt groups as independent draws: none may repeat a prompt
    check_distinct_groups(s["batch_sizes"], s["rows_per_point"], len(prompts))
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
                         "groups": group_count(b, s["rows_per_point"]),
                         **analyse_point(cells, b, s["max_tokens"], s["max_k"]),
                         "profile_acceptance": m["profile_acceptance"]}
                if hf and b not in hf_batch:
                    point["skipped"] = HF_SKIPPED
                points.append(point)
        hf_info = hf_pair.info if hf_pair else None
    return {"schema": "dsd_jax.side_by_side/1", "environment": environment(),
            "settings": {**s, "hf_batch_sizes": hf_batch}, "hf": hf_info, "points": points,
            "summary": summarize(points),
            "seconds": {"per_max_seq_len": seconds, "total": round(time.perf_counter() - t_start, 2)}}


def builtin_prompts(n: int, n_profile: int, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """Held-out prompts as token ids: n for the benchmark, n_profile disjoint ones for profiling."""
    texts = models.heldout_prompts(n + n_profile)
    ids = [tokenizer.encode(t).ids for t in texts]
    return ids[:n], ids[n:]


def run_builtin(settings: dict, out: str | os.PathLike, *, compilation_cache_dir: str | None = None,
                log: Callable = print) -> dict:
    """The comparison on the built-in pair; writes out/results.json and out/results.png."""
    s = settings
    target, draft, tokenizer = models.builtin()
    # every point's groups distinct prompts: ceil(rows / B) groups of B may take more than rows
    prompts, profile_prompts = builtin_prompts(sweep_prompts(s["batch_sizes"], s["rows_per_point"]),
                                               s["profile_prompts"], tokenizer)
    doc = run(target, draft, prompts, profile_prompts, s, hf=bool(s["hf_batch_sizes"]),
              compilation_cache_dir=compilation_cache_dir, log=log)
    doc["models"] = "built-in pair (dsd_jax.models.builtin)"
    write_results(doc, out)
    return doc
