"""Engines, controllers, interleaved repeats and the per-point statistics of a benchmark.

Engines: `vanilla` is its own engine (``SpecConfig(method="none")``: target only, no
draft state). Every speculative configuration of one method shares **one** engine of
that method (the draft model's, and the EAGLE-3 head's for the "eagle3-" names)
compiled for K = 0..max_k; a configuration is the controller object swapped into
``engine.controller`` before each run (`Runner.controller`). The (K, bucket) program a
step runs is the same executable whichever controller chose K, so sharing the engine
changes no measured step; it saves compiling the grid once per configuration. Static
controllers are stateless; a dynamic one is built once and kept for the whole bench, as
a serving engine keeps its controller across calls, so live acceptance learnt in earlier
runs corrects the profile's.

Interleaving (`run_interleaved`): for each repeat, for each point and each of its pair
units, the configurations run back to back in a rotated order (`turns`): a unit's
order moves by one each repeat, and over a point's repeats x units every configuration
runs first, and at every position, equally often (to within one), so slow drift of the
machine (thermal, other processes) and the cost of running first spread over all of them.
A `Cell` keeps every run of one configuration at one point: tokens/s per pair unit (the
paired samples of `dsd_jax.stats`) and, per repeat, wall time, outputs and the engine's
step statistics.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable

from dsd_jax.bench.settings import DYNAMIC_OBJECTIVES, base_name, method_of, methods_of, parse_config
from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.controller import Controller
from dsd_jax.divergence import first_divergence
from dsd_jax.profile import Profile

# controller statistics a run records (the goodput controller's calibration)
CONTROLLER_KEYS = ("itl_mape", "al_mape", "acceptance", "table_refreshes", "using_live_acceptance", "probes",
                   "latency_factors")


def median(xs) -> float:
    return float(statistics.median(xs))


def _engine_max_k(configs: list[str], max_k: int) -> int:
    """The largest K an engine running `configs` (one method's) needs: the static Ks, and
    max_k for a dynamic configuration."""
    kinds = [parse_config(c) for c in configs]
    static_ks = [k for kind, k in kinds if kind == "static"]
    dynamic = any(kind == "dynamic" for kind, _ in kinds)
    return max([max_k] + static_ks) if dynamic else max(static_ks, default=0)


def _buckets_upto(buckets, max_batch: int) -> tuple[list[int] | None, int]:
    """(the buckets of an engine holding max_batch requests, its slots): the given buckets up
    to the first one that holds max_batch (None: the engine's defaults)."""
    if buckets is None:
        return None, max_batch
    top = min((b for b in buckets if b >= max_batch), default=max_batch)
    return [b for b in buckets if b < top] + [top], top


class Runner:
    """The engines and controllers of one benchmark; `run` is one timed `generate`.

    draft: the draft model (configurations without a prefix); eagle3: the EAGLE-3 head
    (`dsd_jax.models.load_eagle3`; the "eagle3-" configurations). Each method present gets one
    engine; max_k is the dynamic configurations' largest K (an int, or {method: K});
    `method_max_batch` ({method: n}) gives a method's engine fewer slots than
    max_batch_size (and only the batch buckets up to them)."""

    def __init__(self, target, draft, tokenizer, *, configs, max_batch_size, max_seq_len, max_k,
                 batch_buckets, prefill_chunk, compilation_cache_dir, log, mesh=None, eagle3=None,
                 method_max_batch: dict | None = None):
        from dsd_jax.engine import SpecEngine
        self.log = log
        self.configs = configs
        k_of = max_k if isinstance(max_k, dict) else {m: max_k for m in methods_of(configs)}
        self.max_ks = {m: _engine_max_k([c for c in configs if method_of(c) == m], k_of[m])
                       for m in methods_of(configs)}
        self.max_k = max(self.max_ks.values(), default=0)
        common = dict(max_seq_len=max_seq_len, tokenizer=tokenizer, prefill_chunk=prefill_chunk,
                      compilation_cache_dir=compilation_cache_dir, mesh=mesh)
        self.vanilla = SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=max_batch_size,
                                  batch_buckets=batch_buckets, **common)
        given = {"draft_model": draft, "eagle3": eagle3}
        self.by_method = {}
        for m, k in self.max_ks.items():
            if given[m] is None:
                raise ValueError("speculative configurations need a draft model" if m == "draft_model" else
                                 "eagle3 configurations need an EAGLE-3 head (eagle3=models.load_eagle3(...))")
            buckets, slots = _buckets_upto(batch_buckets, (method_max_batch or {}).get(m, max_batch_size))
            self.by_method[m] = SpecEngine(target, given[m], SpecConfig(method=m, num_speculative_tokens=k),
                                           max_batch_size=slots, batch_buckets=buckets, **common)
        self.spec = self.by_method.get("draft_model")  # the draft model's engine (None without one)
        self.max_batch_size = max_batch_size
        self._dynamic: dict[str, Controller] = {}  # one goodput controller per name, built on first use
        self.profiles: dict[str, Profile] = {}  # per method: the dynamic configurations' profile
        self.profile_paths: dict[str, str | None] = {}

    def engine_for(self, config: str):
        """The engine a configuration runs on."""
        return self.vanilla if config == "vanilla" else self.by_method[method_of(config)]

    def profile_for(self, config: str) -> Profile | None:
        """The profile a configuration's step times are compared with: its method's (vanilla:
        the draft model's K = 0 column, else the head's)."""
        if config == "vanilla":
            return self.profiles.get("draft_model") or self.profiles.get("eagle3")
        return self.profiles.get(method_of(config))

    def engines(self):
        return [self.vanilla, *self.by_method.values()]

    @property
    def batch_buckets(self) -> list[int]:
        return list(self.vanilla.batch_buckets)

    def warmup(self) -> int:
        """Compiles every program of every engine; returns how many."""
        n = 0
        names = {id(e): m for m, e in self.by_method.items()}
        for e in self.engines():
            t0 = time.perf_counter()
            n += e.warmup()
            what = "vanilla" if e is self.vanilla else f"{names[id(e)]} K=0..{e.max_k}"
            self.log(f"  compiled the {what} engine ({len(e.batch_buckets)} batch buckets) in "
                     f"{time.perf_counter() - t0:.1f} s")
        return n

    def controller(self, config: str):
        """The configuration's controller (None: vanilla's engine runs without one). Sized per
        data shard, as the engine builds its own: the batch buckets count a shard's slots."""
        kind, k = parse_config(config)
        if kind == "vanilla":
            return None
        method = method_of(config)
        engine = self.by_method[method]
        if kind == "static":
            return Controller(SpecConfig(method=method, num_speculative_tokens=k), None, engine.slots_per_shard,
                              batch_buckets=engine.batch_buckets)
        if self.profiles.get(method) is None:
            raise RuntimeError(f"the {config} configuration needs a profile of the {method} engine")
        if config not in self._dynamic:
            spec = SpecConfig(method=method, num_speculative_tokens=engine.max_k,
                              dynamic=DynamicConfig(profile=self.profile_paths.get(method),
                                                    objective=DYNAMIC_OBJECTIVES[base_name(config)]))
            self._dynamic[config] = Controller(spec, self.profiles[method], engine.slots_per_shard,
                                               batch_buckets=engine.batch_buckets)
        return self._dynamic[config]

    def run(self, config: str, prompts, sampling):
        """One timed `generate`: (wall seconds, outputs' token ids, run statistics)."""
        engine = self.engine_for(config)
        ctl = self.controller(config)
        if ctl is not None:
            engine.controller = ctl
        engine.stats.reset()
        # configurations share an engine and repeat the prompts: each call starts cold, not
        # from the slots the last one's requests finished in (`prefix_sharing`)
        engine.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sampling)
        wall = time.perf_counter() - t0
        return wall, [o.token_ids for o in outs], _run_info(engine, ctl)


def _run_info(engine, ctl) -> dict:
    """The engine's statistics of the run just finished; decode-only figures leave out the
    steps of every dispatch that ran right after a prefill (their times include it)."""
    st = engine.stats
    decode = [t for t in st.trace if not t["after_prefill"]]
    info = {"row_steps": int(st.row_steps), "steps": int(st.steps),
            "k_hist": {int(k): int(v) for k, v in sorted(st.k_hist.items())},
            "decode_tokens": int(sum(t["emitted"] for t in decode)),
            "decode_s": float(sum(t["wall_ms"] for t in decode) / 1e3),
            # (K, batch bucket, wall ms, context) of every decode-only step, for calibration:
            # the bucket and context its program ran at
            "step_ms": [(t["k"], t["bucket"], t["wall_ms"], t["context"]) for t in decode],
            "accepted": st.accepted_per_pos.copy(), "proposed": st.proposed_per_pos.copy(),
            "controller_s": float(st.controller_s)}
    stats = getattr(ctl, "stats", None)
    if ctl is not None and ctl.mode == "goodput" and callable(stats):
        c = stats()
        info["controller"] = {k: c.get(k) for k in CONTROLLER_KEYS}
    return info


def add_hist(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


def merge_info(a: dict, b: dict) -> dict:
    """The statistics of two runs of one configuration: counts add, step lists concatenate,
    per-position acceptance arrays add, the controller's are the later run's."""
    out = {k: a[k] + b[k] for k in ("row_steps", "steps", "decode_tokens", "decode_s", "step_ms", "accepted",
                                    "proposed", "controller_s")}
    out["k_hist"] = add_hist(a["k_hist"], b["k_hist"])
    out["controller"] = b.get("controller")
    return out


def mismatches(outs: list, ref: list) -> int:
    """Requests whose tokens differ from the reference's (a missing request counts)."""
    return sum(o != r for o, r in zip(outs, ref)) + abs(len(outs) - len(ref))


def divergences(point, config: str) -> list[dict]:
    """Each request of `config` at `point` whose greedy tokens differ from vanilla's: its
    repeat, its place among the repeat's requests, and the first token that differs
    (`run.diagnose` adds the target's top-2 gap there)."""
    pairs = zip(point.cells[config].outputs, point.cells["vanilla"].outputs)
    return [{"repeat": rep, "request": i, "position": at}
            for rep, (outs, ref) in enumerate(pairs)
            for i, (o, r) in enumerate(zip(outs, ref)) if (at := first_divergence(o, r)) is not None]


class Cell:
    """Every timed run of one configuration at one point."""

    def __init__(self):
        self.pairs: list[float] = []  # tokens/s of each pair unit, in run order
        self.walls: list[float] = []  # per repeat: seconds over the point's pair units
        self.tokens: list[int] = []  # per repeat
        self.outputs: list[list] = []  # per repeat: every request's tokens, unit after unit
        self.infos: list[dict | None] = []  # per repeat: run statistics (engine configurations)

    def add(self, rep: int, wall: float, outs: list, info: dict | None = None) -> None:
        tokens = sum(len(o) for o in outs)  # what generate returned, for every kind of configuration
        self.pairs.append(tokens / wall)
        if rep == len(self.walls):  # the first unit of a repeat
            self.walls.append(0.0)
            self.tokens.append(0)
            self.outputs.append([])
            self.infos.append(None)
        self.walls[rep] += wall
        self.tokens[rep] += tokens
        self.outputs[rep] += outs
        if info:
            self.infos[rep] = info if self.infos[rep] is None else merge_info(self.infos[rep], info)

    def tokens_per_s(self) -> list[float]:
        """Per repeat."""
        return [t / w for t, w in zip(self.tokens, self.walls)]

    def total(self) -> dict | None:
        """The run statistics of every repeat together (None: not an engine configuration)."""
        infos = [i for i in self.infos if i]
        return functools.reduce(merge_info, infos) if infos else None


def rotated(configs: list[str], turn: int) -> list[str]:
    r = turn % len(configs)
    return configs[r:] + configs[:r]


def turns(points, repeats: int) -> dict[tuple[int, int, int], int]:
    """(point index, unit index, repeat) -> the rotation its configurations run in.

    Each unit takes a block of consecutive turns, one per repeat that runs it
    (`Point.units_of`): its order moves by one each repeat, and a point's runs are
    consecutive turns, so every
    configuration runs first (and at every position) equally often over the point, to within
    one. (rep + unit index, the earlier scheme, was uneven when neither the repeats nor the
    units were a multiple of the configurations: at 3 repeats of 4 groups 7 configurations led
    3, 3, 2, 2, 1, 1 and 0 times, and running first costs ~1.6% of tokens/s.) The blocks
    continue from point to point, so at a point with fewer turns than configurations the
    ones left out differ between points."""
    out, start = {}, 0
    for i, p in enumerate(points):
        runs = sorted((u, rep) for rep in range(repeats) for u in p.units_of(rep))
        out.update({(i, u, rep): start + n for n, (u, rep) in enumerate(runs)})
        start += len(runs)
    return out


def run_interleaved(points, run: Callable, repeats: int, on_repeat: Callable | None = None) -> None:
    """Runs every point's pair units (`Point.units_of` each repeat), configurations taking turns unit by unit
    (a slow stretch of the machine lasting a few seconds is shared out instead of landing on
    one configuration) in the rotation `turns` gives, into ``point.cells``. run(config, point,
    u) -> (wall, outputs, info or None) for the point's unit u; on_repeat(rep, point) after each
    repeat of a point."""
    for p in points:  # cells in configuration order, whichever ran first
        p.cells.update({c: Cell() for c in p.configs if c not in p.cells})
    turn = turns(points, repeats)
    for rep in range(repeats):
        for i, p in enumerate(points):
            for u in p.units_of(rep):
                for c in rotated(p.configs, turn[(i, u, rep)]):
                    p.cells[c].add(rep, *run(c, p, u))
            if on_repeat is not None:
                on_repeat(rep, p)


# --------------------------------------------------------------------------- rows

def calibration(step_ms, profile: Profile | None) -> list[dict]:
    """Measured step time per (K, bucket) (median over steps) next to the profile's ITL
    (the median of its ITL at each step's context)."""
    groups: dict[tuple, list[tuple[float, int]]] = {}
    for k, b, ms, context in step_ms:
        groups.setdefault((int(k), int(b)), []).append((float(ms), int(context)))
    out = []
    for (k, b), steps in sorted(groups.items()):
        ms = [m for m, _ in steps]
        entry = {"k": k, "bucket": b, "steps": len(ms), "measured_ms": round(median(ms), 3)}
        if profile is not None and k <= profile.max_k:
            pred = median([profile.itl_ms(b, k, context) for _, context in steps])
            entry["profile_ms"] = round(pred, 3)
            entry["measured_over_profile"] = round(entry["measured_ms"] / pred, 3)
        out.append(entry)
    return out


def _throughput(point, config: str, cell: Cell) -> dict:
    """The sweep's tokens/s is the median over repeats; the rollout's comes from the median
    makespan (a repeat's: the mean over its rollouts)."""
    if point.workload == "sweep":
        return {"batch_size": point.batch_size, "config": config, "tokens_per_s": median(cell.tokens_per_s()),
                "wall_s": median(cell.walls), "prompts": len(cell.outputs[0])}
    units = len(point.units)
    makespan = median(cell.walls) / units
    return {"config": config, "makespan_s": makespan, "tokens_per_s": cell.tokens[0] / units / makespan,
            "num_requests": len(cell.outputs[0]) // units, "rollouts": units}


def point_row(point, config: str, profile: Profile | None) -> dict:
    """One configuration at one point: throughput, losslessness against vanilla, the engine's
    step statistics over every repeat."""
    cell = point.cells[config]
    mism = [mismatches(outs, ref) for outs, ref in zip(cell.outputs, point.cells["vanilla"].outputs)]
    infos, total = cell.infos, cell.total()
    dec = [i["decode_tokens"] / i["decode_s"] for i in infos if i["decode_s"] > 0]
    row = {"workload": point.workload, **_throughput(point, config, cell)}
    row.update(decode_tokens_per_s=median(dec) if dec else None, tokens=cell.tokens[0], steps=infos[0]["steps"],
               mean_accepted_len=sum(cell.tokens) / total["row_steps"] if total["row_steps"] else None,
               # host time in the K controller a round (`EngineStats.controller_s`)
               controller_ms_per_step=total["controller_s"] * 1e3 / total["steps"] if total["steps"] else None,
               k_hist={str(k): v for k, v in total["k_hist"].items()},
               lossless=all(m == 0 for m in mism), mismatched_requests=max(mism),
               divergences=divergences(point, config),
               tokens_per_s_repeats=[round(x, 3) for x in cell.tokens_per_s()], repeats=len(cell.walls),
               tokens_per_s_pairs=[round(x, 3) for x in cell.pairs],
               pair_units=point.pair_units(len(cell.walls)),
               step_calibration=calibration(total["step_ms"], profile))
    if infos[0].get("controller") is not None:
        row["controller"] = infos[-1]["controller"]
    return row


def add_speedups(rows: list[dict]) -> None:
    """Each row's tokens/s (and decode-only tokens/s) over vanilla's at the same point, in place."""
    base = {(r["workload"], r.get("batch_size")): r for r in rows if r["config"] == "vanilla"}
    for r in rows:
        v = base[(r["workload"], r.get("batch_size"))]
        r["speedup_vs_vanilla"] = r["tokens_per_s"] / v["tokens_per_s"]
        r["decode_speedup_vs_vanilla"] = (r["decode_tokens_per_s"] / v["decode_tokens_per_s"]
                                          if r["decode_tokens_per_s"] and v["decode_tokens_per_s"] else None)
