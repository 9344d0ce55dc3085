"""The bench's two modes, its configuration names, and the settings of one run."""

from __future__ import annotations

import dataclasses
from typing import Sequence

# Settings of the two modes (every one can be overridden).
# FULL: 6 repeats (each committed bench ran --repeats 6; 3 left B=1-2 intervals wider than 5%).
# The intervals resample prompt groups (`dsd_jax.bench.pairs`): ceil(rows_per_point / B) of
# them per point, each repeat's its own at 3 repeats or more where the held-out prompts hold
# them (`workloads.fresh_groups`: to B = 64 at 6 repeats), so every point has repeats x groups
# independent units; without them B >= 4 (2 groups: a t_1 interval) and B >= 8 (1 group:
# none) cannot resolve 5% whatever the repeats. FULL's `min_units` adds groups where the
# prompts hold them, so a point has at least 18 units (B = 4-32; B = 64 keeps 6): at 6, the
# units' ratios spreading 5-7% left dynamic's B = 8-32 +-5.6-7.8% wide (`bench_full_s21`). The rollout's
# groups are `rollout_units` rollouts, each with its own prompts and seeded lengths: FULL's 6
# give a t_5 interval (3 left dynamic's rollout +-14% of vanilla's in `bench_full_s27`; 6,
# +-4.7%: `results/rollout_units/`); QUICK's 1, none.
FULL = dict(batch_sizes=(1, 2, 4, 8, 16, 32, 64),
            configs=("vanilla", "static-1", "static-2", "static-3", "static-4", "static-6", "dynamic"),
            repeats=6, max_tokens=64, prompt_len=128, rows_per_point=8, min_units=18,
            rollout_requests=64, rollout_prompt_len=64, rollout_median_tokens=32, rollout_max_tokens=320,
            rollout_units=6, max_seq_len=448, max_k=6, batch_buckets=None, prefill_chunk=None,
            eagle3_max_batch=None, eagle3_max_k=None,
            profile_repeats=7, profile_warmup_reps=2, profile_prompts=16, profile_max_tokens=64)
# --quick compiles 4 batch buckets (the sweep's batch sizes) and K <= 3: 38 programs, still
# more than half of the demo's time on 2 slow CPU cores (K <= 4 took the demo to 5 minutes).
# A smoke run: its points cannot resolve 5%, and the table says so (`report._quick_lines`).
QUICK = dict(batch_sizes=(1, 4, 16, 64),
             configs=("vanilla", "static-1", "static-3", "dynamic"),
             repeats=2, max_tokens=24, prompt_len=64, rows_per_point=4, min_units=0,
             rollout_requests=64, rollout_prompt_len=48, rollout_median_tokens=12, rollout_max_tokens=112,
             rollout_units=1, max_seq_len=160, max_k=3, batch_buckets=(1, 4, 16, 64), prefill_chunk=32,
             eagle3_max_batch=None, eagle3_max_k=None,
             profile_repeats=7, profile_warmup_reps=2, profile_prompts=8, profile_max_tokens=48)

WORKLOADS = ("sweep", "rollout")

# dynamic configurations -> DynamicConfig.objective
DYNAMIC_OBJECTIVES = {"dynamic": "makespan", "dynamic-throughput": "throughput"}

# The speculative methods a bench compares. A configuration name without a prefix runs the
# draft model; "eagle3-" + a name (eagle3-static-2, eagle3-dynamic) runs the EAGLE-3 head.
METHODS = ("draft_model", "eagle3")
EAGLE3_PREFIX = "eagle3-"


def mode(quick: bool) -> dict:
    return QUICK if quick else FULL


def method_of(name: str) -> str | None:
    """The speculative method a configuration runs: None for vanilla, "eagle3" for the
    "eagle3-" names, else "draft_model"."""
    if name == "vanilla":
        return None
    return "eagle3" if name.startswith(EAGLE3_PREFIX) else "draft_model"


def base_name(name: str) -> str:
    """The name without its method prefix ("eagle3-static-2" -> "static-2")."""
    return name[len(EAGLE3_PREFIX):] if name.startswith(EAGLE3_PREFIX) else name


def parse_config(name: str) -> tuple[str, int | None]:
    """"vanilla" -> ("vanilla", None); "static-3" -> ("static", 3); "dynamic" and
    "dynamic-throughput" -> ("dynamic", None); the same with the "eagle3-" prefix (which
    method runs it: `method_of`)."""
    if not isinstance(name, str):
        raise ValueError(f"configuration names are strings, got {name!r}")
    if name == "vanilla":
        return name, None
    base = base_name(name)
    if base in DYNAMIC_OBJECTIVES:
        return "dynamic", None
    if base.startswith("static-"):
        try:
            k = int(base[len("static-"):])
        except ValueError:
            k = -1
        if k >= 1:
            return "static", k
    raise ValueError(f"unknown configuration {name!r}: use vanilla, static-K (K >= 1), dynamic or "
                     "dynamic-throughput (the draft model), or the same prefixed with 'eagle3-' "
                     "(the EAGLE-3 head: eagle3-static-2, eagle3-dynamic)")


def config_list(configs) -> list[str]:
    """Validated configuration names (a list or a comma-separated string), "vanilla" first
    when it was not asked for: the baseline of speedups and the lossless check."""
    if isinstance(configs, str):
        configs = [c.strip() for c in configs.split(",") if c.strip()]
    configs = list(dict.fromkeys(configs))
    if not configs:
        raise ValueError("no configurations to run")
    for c in configs:
        parse_config(c)
    if "vanilla" not in configs:
        configs.insert(0, "vanilla")
    return configs


def has_dynamic(configs, method: str | None = None) -> bool:
    """Whether a dynamic configuration (of `method`, None: of any) is among `configs`."""
    return any(parse_config(c)[0] == "dynamic" and method in (None, method_of(c)) for c in configs)


def methods_of(configs) -> list[str]:
    """The speculative methods the configurations run, in `METHODS` order."""
    used = {method_of(c) for c in configs}
    return [m for m in METHODS if m in used]


def with_method(configs, method: str) -> list[str]:
    """Draft-model configuration names turned into `method`'s ("vanilla" stays)."""
    prefix = EAGLE3_PREFIX if method == "eagle3" else ""
    return [c if c == "vanilla" else prefix + base_name(c) for c in configs]


def int_list(name: str, v) -> list[int]:
    """Sorted distinct integers >= 1 from a sequence or a comma-separated string."""
    if isinstance(v, str):
        try:
            v = [int(x) for x in v.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{name} must be comma-separated integers, got {v!r}") from None
    out = sorted({int(x) for x in v})
    if not out or out[0] < 1:
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {v!r}")
    return out


@dataclasses.dataclass
class Settings:
    """Everything one `run_bench` call runs with, the mode's defaults filled in."""
    quick: bool
    configs: list[str]
    batch_sizes: list[int]
    workloads: tuple[str, ...]
    repeats: int
    max_tokens: int
    prompt_len: int
    rows_per_point: int
    min_units: int  # pair units a sweep point gets at least, where the prompts hold them
    max_k: int
    rollout_requests: int  # 0 without the rollout workload
    rollout_prompt_len: int
    rollout_median_tokens: int
    rollout_max_tokens: int  # capped so that a rollout request fits in max_seq_len
    rollout_units: int  # rollouts of rollout_requests each (their own prompts and lengths): the pair units
    max_seq_len: int
    batch_buckets: list[int] | None  # None: the engine's default buckets
    prefill_chunk: int
    seed: int
    eagle3_max_batch: int | None = None  # eagle3 configurations run at batch sizes <= this only
    eagle3_max_k: int | None = None  # eagle3-dynamic's largest K (None: max_k)

    def method_max_k(self, method: str) -> int:
        """The largest K a dynamic configuration of `method` may choose."""
        return self.eagle3_max_k if method == "eagle3" and self.eagle3_max_k else self.max_k

    @property
    def max_batch(self) -> int:
        return max(self.batch_sizes + [self.rollout_requests])

    def runs_at(self, config: str, batch_size: int) -> bool:
        """Whether `config` runs at a point of `batch_size` requests (the rollout: all of them)."""
        return self.method_runs_at(method_of(config), batch_size)

    def method_runs_at(self, method: str | None, batch_size: int) -> bool:
        return method != "eagle3" or self.eagle3_max_batch is None or batch_size <= self.eagle3_max_batch

    def method_max_batch(self, method: str) -> int:
        """The most requests `method`'s engine holds at once in this run."""
        sizes = self.batch_sizes + ([self.rollout_requests] if self.rollout_requests else [])
        return max((b for b in sizes if self.method_runs_at(method, b)), default=1)


def _buckets(given: Sequence[int] | None, defaults, batch_sizes: list[int], max_batch: int) -> list[int] | None:
    """The mode's buckets when they cover the run; given buckets grown to hold max_batch."""
    if given is None and defaults is not None and set(batch_sizes) <= set(defaults) and max_batch <= max(defaults):
        given = defaults
    if given is None:
        return None
    buckets = int_list("batch_buckets", given)
    if buckets[-1] < max_batch:
        buckets.append(max_batch)
    return buckets


def prefill_chunk_for(prompt_len: int) -> int:
    """One chunk covers a prompt: no column padding to the default 256."""
    return min(256, 1 << max(4, (prompt_len - 1).bit_length()))


def eagle3_max_batch_error(e3: int | None, configs, batch_sizes, rollout_requests: int) -> str | None:
    """Why an eagle3_max_batch `e3` does not fit the run (None: it does): below every batch
    size (the rollout's `rollout_requests` among them; 0: no rollout) the eagle3 configurations
    asked for would never run. `dsd-jax bench` checks it before loading any model."""
    sizes = list(batch_sizes) + ([rollout_requests] if rollout_requests else [])
    if e3 is None or "eagle3" not in methods_of(configs) or int(e3) >= min(sizes):
        return None
    return (f"{e3} is below every batch size of the run ({', '.join(map(str, sizes))}): the eagle3 "
            "configurations would never run")


def resolve(quick: bool, given: dict, profile_seq_len: int | None = None) -> Settings:
    """`Settings` from `run_bench`'s keyword arguments (`given`; None: the mode's default).
    Without a max_seq_len the run takes the profile's (`profile_seq_len`): step latency
    depends on the KV-cache size."""
    d = mode(quick)
    pick = {k: d[k] if given.get(k) is None else given[k] for k in d}
    workloads = tuple(given.get("workloads") or ())
    if not workloads or not set(workloads) <= set(WORKLOADS):
        raise ValueError(f"workloads must be a subset of {WORKLOADS}, got {workloads}")
    ints = {k: int(pick[k]) for k in ("repeats", "max_tokens", "prompt_len", "rows_per_point", "min_units", "max_k",
                                      "rollout_prompt_len", "rollout_median_tokens", "rollout_units")}
    if min(ints["repeats"], ints["max_tokens"], ints["prompt_len"], ints["rows_per_point"],
           ints["rollout_units"]) < 1:
        raise ValueError("repeats, max_tokens, prompt_len, rows_per_point and rollout_units must be >= 1")
    if ints["min_units"] < 0:
        raise ValueError(f"min_units must be >= 0, got {ints['min_units']}")
    batch_sizes = int_list("batch_sizes", pick["batch_sizes"])
    n_roll = int(pick["rollout_requests"]) if "rollout" in workloads else 0
    seq = given.get("max_seq_len") or profile_seq_len or d["max_seq_len"]
    seq = int(max(seq, ints["prompt_len"] + ints["max_tokens"]))
    roll_cap = max(1, min(int(pick["rollout_max_tokens"]), seq - ints["rollout_prompt_len"]))
    chunk = pick["prefill_chunk"] or prefill_chunk_for(max(ints["prompt_len"], ints["rollout_prompt_len"]))
    max_batch = max(batch_sizes + [n_roll])
    e3, e3k = pick["eagle3_max_batch"], pick["eagle3_max_k"]
    for name, v in (("eagle3_max_batch", e3), ("eagle3_max_k", e3k)):
        if v is not None and int(v) < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {v!r}")
    configs = config_list(pick["configs"])
    why = eagle3_max_batch_error(e3, configs, batch_sizes, n_roll)
    if why:
        raise ValueError(f"eagle3_max_batch {why}")
    return Settings(quick=bool(quick), configs=configs, batch_sizes=batch_sizes,
                    workloads=workloads, rollout_requests=n_roll, rollout_max_tokens=roll_cap, max_seq_len=seq,
                    batch_buckets=_buckets(given.get("batch_buckets"), d["batch_buckets"], batch_sizes, max_batch),
                    prefill_chunk=int(chunk), seed=int(given.get("seed") or 0),
                    eagle3_max_batch=None if e3 is None else int(e3),
                    eagle3_max_k=None if e3k is None else int(e3k), **ints)
