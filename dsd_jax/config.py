"""Speculative-decoding configuration (vLLM `speculative_config` names).

`SpecConfig` is a frozen, fully validated value: every malformed input raises a
`ValueError` whose message names the offending field (never a TypeError/KeyError
from inside). Host-side only; this module does not import JAX.

Controller modes (`SpecConfig.controller_mode`):

- ``"none"``: ``method="none"``; K is always 0 (plain decoding).
- ``"static"``: K = ``num_speculative_tokens`` every step.
- ``"schedule"``: vLLM's ``num_speculative_tokens_per_batch_size``, a list of
  inclusive ``[start_bs, end_bs, K]`` ranges, sorted and non-overlapping. A live
  batch size that no range covers uses **K = 0** (a schedule is an allow-list:
  "speculate this much in these ranges", so a gap means "do not speculate").
- ``"goodput"``: ``dynamic`` is given; K = argmax_K AL(K) / ITL(B, K) from a
  profile (see `dsd_jax.controller`).

``disable_by_batch_size`` (vLLM V0's ``speculative_disable_by_batch_size``) forces
K = 0 whenever the live batch size is at least it (vLLM V0 disables speculation when
``running_queue_size >= disable_by_batch_size``); it applies on top of every mode
(static, schedule and goodput).

"Live batch size" is the batch one step runs. On a mesh with a "data" axis that is the
live requests of the fullest data shard, not of the whole engine: each data shard is
like one vLLM data-parallel rank, whose own batch these settings would see. The engine
chooses a dispatch's K before it reads back the dispatch ahead of it (pipelining), so the
dispatch right after rows finish runs the K of the batch size before.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import reprlib
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

from dsd_jax import drafters  # the registry only: no JAX

__all__ = ["SpecConfig", "DynamicConfig", "ACCEPTANCE_MODES", "DRAFT_SAMPLING_MODES", "OBJECTIVES",
           "MAX_PROMPT_LOOKUP"]

ACCEPTANCE_MODES = ("rejection", "drafter_invariant")
DRAFT_SAMPLING_MODES = ("sample", "argmax")
OBJECTIVES = ("throughput", "makespan")
# Largest prompt_lookup_max: the lookup unrolls one compare over the buffer per n, so
# compile time grows with n^2 (about 7.5 s for one lookup at 64 on CPU, 124 s at 256).
MAX_PROMPT_LOOKUP = 64
# Largest num_speculative_tokens: one step program is compiled per K up to it, and
# acceptance past a few dozen drafted tokens is nil for any drafter.
MAX_SPECULATIVE_TOKENS = 64
# Largest suffix_bank_len (tokens of references per slot, int32 on the device).
MAX_SUFFIX_BANK_LEN = 1 << 20

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = 8


def _show(v: Any) -> str:
    return f"{_repr.repr(v)} ({type(v).__name__})"


# --------------------------------------------------------------------------- validators


def _int(name: str, v: Any, *, min_value: int | None = None, allow_none: bool = False) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name} must be an integer{' or null' if allow_none else ''}, got {_show(v)}")
    v = int(v)
    if min_value is not None and v < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {v}")
    return v


def _float(name: str, v: Any, *, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{name} must be a number, got {_show(v)}")
    try:
        v = float(v)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if (v <= lo) if lo_open else (v < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def _choice(name: str, v: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{name} must be one of {list(choices)}, got {_show(v)}")
    if v not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {v!r}")
    return v


def _opt_str(name: str, v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if not isinstance(v, str):
        raise ValueError(f"{name} must be a string or null, got {_show(v)}")
    return v


def _same_value(a: Any, b: Any) -> bool:
    """Equal up to list vs tuple (JSON gives lists, Python callers often tuples)."""
    def norm(v):
        return tuple(norm(e) for e in v) if isinstance(v, (list, tuple)) else v
    try:
        return bool(norm(a) == norm(b))
    except Exception:  # e.g. arrays (no single truth value): taken as different
        return False


def _reject_unknown(where: str, d: Mapping, known: set[str]) -> None:
    bad = [k for k in d if k not in known]
    if bad:
        names = ", ".join(repr(k) for k in bad)
        raise ValueError(f"unknown key(s) in {where}: {names}; known keys: {sorted(known)}")


def _schedule(v: Any, max_k: int) -> tuple[tuple[int, int, int], ...] | None:
    name = "num_speculative_tokens_per_batch_size"
    if v is None:
        return None
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, (list, tuple)):
        raise ValueError(f"{name} must be a list of [start_bs, end_bs, K] triples, got {_show(v)}")
    if len(v) == 0:
        raise ValueError(f"{name} must not be empty (leave it unset, or use method='none' to disable speculation)")
    out: list[tuple[int, int, int]] = []
    for i, e in enumerate(v):
        if isinstance(e, (str, bytes, Mapping)) or not isinstance(e, (list, tuple)) or len(e) != 3:
            raise ValueError(f"{name}[{i}] must be a [start_bs, end_bs, K] triple, got {_show(e)}")
        s = _int(f"{name}[{i}][0] (start_bs)", e[0], min_value=1)
        t = _int(f"{name}[{i}][1] (end_bs)", e[1], min_value=1)
        k = _int(f"{name}[{i}][2] (K)", e[2], min_value=0)
        if s > t:
            raise ValueError(f"{name}[{i}] = [{s}, {t}, {k}]: start_bs {s} > end_bs {t}")
        if k > max_k:
            raise ValueError(
                f"{name}[{i}] = [{s}, {t}, {k}]: K {k} exceeds num_speculative_tokens (max K) = {max_k}"
            )
        out.append((s, t, k))
    for i in range(1, len(out)):
        (ps, pt, pk), (s, t, k) = out[i - 1], out[i]
        if s < ps:
            raise ValueError(
                f"{name} must be sorted by start_bs: [{s}, {t}, {k}] (entry {i}) comes after [{ps}, {pt}, {pk}]"
            )
        if s <= pt:
            raise ValueError(
                f"{name} ranges overlap: [{ps}, {pt}, {pk}] (entry {i - 1}) and [{s}, {t}, {k}] (entry {i})"
            )
    return tuple(out)


# --------------------------------------------------------------------------- DynamicConfig


@dataclass(frozen=True)
class DynamicConfig:
    """Goodput-controller settings.

    profile: path of the profile JSON (`dsd_jax.profile.Profile`); the controller
        loads it when no `Profile` object is passed to it.
    warmup_steps: number of observed steps with K > 0 before live acceptance
        counts replace the profile's acceptance.
    forgetting: weight of the newest step in the exponential average of the live
        acceptance, in (0, 1]; 1 keeps only the last step for the drafts it ran (those
        past its K fade at a quarter of the rate: `acceptance.STALE_FORGETTING`).
    margin: relative goodput gain needed to move off the current K (and off the
        initial K = 0); hysteresis against flapping between near-tied Ks.
    per_request: goodput = sum over requests of each request's own AL_r(K), divided
        by ITL(B, K). A request's acceptance is its own counts (with the same
        forgetting) shrunk toward the global estimate, at draft 1 toward the mean rate
        of recent finished requests once 4 ran drafts; the target weighs as 4 steps.
    probe_interval: every `probe_interval`-th choice of K (one dispatch) may be a
        probe. While the controller holds K = 0 at a batch size where
        the profile's acceptance would speculate (its best K ahead of K = 0 by more
        than `margin`), a probe runs that K instead, so
        live acceptance keeps being measured and can bring speculation back (without
        probes a K = 0 decision could never be revised: K = 0 steps measure no
        acceptance). Such an acceptance probe comes less often where it is dear for
        what it could win: its extra step time is kept under a quarter of the time
        its K would save if the profile's acceptance came back (on the CPU bench's
        profile: every 16 choices at B <= 4, 35-85 at B = 8-64). Where only perfect
        acceptance would speculate, a rarer optimistic probe asks whether live acceptance
        is far above the profile's (at most 1% of the time where it is not). A probe whose
        step beat K = 0 and accepted more than the estimate expected is followed by another
        at the next choice, up to 15 in a row, so one chain lifts the estimate. With latency
        learning on, probes are also spaced by what they really cost (the draft's catch-up
        in the first K > 0 round after K = 0 rounds, measured per batch bucket; at most 4x
        the interval), and a probe may time a close contender (`explore_gap`). 0
        disables probing.
    latency_forgetting: weight of the newest observation in the per-(batch bucket,
        K) average of live step time over profiled step time; the controller's ITL
        is the profile's times that learnt factor (`dsd_jax.latency`). The default
        0.05 learns what a profile taken once cannot hold: the speed of the process the
        engine runs in, and what the engine's own dispatches cost around a switch of
        K (a K = 0 step between K > 0 steps ran 1.12x its profiled time at B=4). Over
        four paired bench runs on two profiles it gained 3.5% [1.2, 6.2] at B=4 and
        moved nothing resolvably elsewhere (`benchmarks/results/latency_learning/`).
        0 trusts the profile as it is.
    explore_gap: with latency learning on, a probe step (every `probe_interval`-th)
        runs another K whose predicted goodput is within this fraction of the held
        K's and whose latency at this batch bucket has been measured fewer than
        about 14 times at the default `latency_forgetting` (a discounted weight below
        min(16, 0.5 / latency_forgetting)), so close contenders are timed too, not only the winner. The
        cost is bounded: a few steps per (bucket, K), each at most this fraction
        slower. 0 (the default) disables it: on the 2-vCPU bench machine the drift
        such steps carried cost 3-9% at B >= 8 in the replay, while learning from the
        Ks the controller runs anyway cost nothing there (notes of issues 6 and 13).
    objective: what the choice of K maximises once no request is waiting for a
        slot. "throughput": goodput AL(K) / ITL(B, K) of the live batch, as in
        vLLM (a finished row's slot is refilled at once, so every accepted token
        counts). "makespan": the progress of the critical request, min over live
        requests of AL_r(K) / remaining_r, per ITL(B, K): a batch that nothing
        refills lasts as long as its slowest request, and tokens that easy rows
        gain early only leave their slots empty (fixed groups, RL rollouts). It
        needs each request's remaining token budget, which `SpecEngine` passes,
        and tracks per-request acceptance like `per_request`. While requests are
        queued, both objectives are throughput. The default is "makespan": a
        `SpecEngine.generate` call returns when its last request is done.
    """

    profile: str | None = None
    warmup_steps: int = 16
    forgetting: float = 0.05
    margin: float = 0.03
    per_request: bool = False
    probe_interval: int = 16
    latency_forgetting: float = 0.05
    explore_gap: float = 0.0
    objective: str = "makespan"

    _FIELDS = ("profile", "warmup_steps", "forgetting", "margin", "per_request", "probe_interval",
               "latency_forgetting", "explore_gap", "objective")

    def __post_init__(self):
        object.__setattr__(self, "profile", _opt_str("dynamic.profile", self.profile))
        object.__setattr__(self, "warmup_steps", _int("dynamic.warmup_steps", self.warmup_steps, min_value=0))
        object.__setattr__(
            self, "forgetting", _float("dynamic.forgetting", self.forgetting, lo=0.0, hi=1.0, lo_open=True)
        )
        object.__setattr__(self, "margin", _float("dynamic.margin", self.margin, lo=0.0))
        if not isinstance(self.per_request, bool):
            raise ValueError(f"dynamic.per_request must be true or false, got {_show(self.per_request)}")
        object.__setattr__(self, "probe_interval",
                           _int("dynamic.probe_interval", self.probe_interval, min_value=0))
        object.__setattr__(self, "latency_forgetting",
                           _float("dynamic.latency_forgetting", self.latency_forgetting, lo=0.0, hi=1.0))
        object.__setattr__(self, "explore_gap", _float("dynamic.explore_gap", self.explore_gap, lo=0.0, hi=1.0))
        _choice("dynamic.objective", self.objective, OBJECTIVES)

    @classmethod
    def from_dict(cls, d: Any) -> "DynamicConfig":
        if not isinstance(d, Mapping):
            raise ValueError(f"dynamic must be a dict (or null), got {_show(d)}")
        _reject_unknown("dynamic", d, set(cls._FIELDS))
        return cls(**{k: d[k] for k in cls._FIELDS if k in d})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._FIELDS}


# --------------------------------------------------------------------------- SpecConfig

def read_json_config(src: str | os.PathLike | bytes) -> Any:
    """The JSON value of a speculative config given as JSON text (a string starting with
    '{') or as a path to a JSON file; a ValueError saying which and why when unreadable."""
    if isinstance(src, (bytes, bytearray)):
        src = src.decode("utf-8", errors="replace")
    if isinstance(src, str) and src.lstrip().startswith("{"):
        where, text = "JSON string", src
    elif isinstance(src, (str, os.PathLike)):
        where = f"file {os.fspath(src)!r}"
        try:
            with open(src, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read speculative config {where}: {e}") from None
    else:
        raise ValueError(f"from_json expects JSON text or a path, got {_show(src)}")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"invalid JSON in speculative config {where}: {e}") from None


# Keys vLLM spells differently -> our field name.
_KEY_ALIASES = {
    "speculative_disable_by_batch_size": "disable_by_batch_size",
    "speculative_model": "model",
    "num_speculative_tokens_per_bs": "num_speculative_tokens_per_batch_size",
    "ngram_prompt_lookup_max": "prompt_lookup_max",  # vLLM V0
    "ngram_prompt_lookup_min": "prompt_lookup_min",
}
NGRAM_MODEL = "[ngram]"  # vLLM V0's `speculative_model` for prompt lookup


def _fill_lookup_sizes(kw: dict, v0: bool) -> None:
    """vLLM's n-gram sizes in a speculative config: a bound not given (or null) is the other
    one (vLLM V0's spelling: a missing minimum is 1). With neither, `SpecConfig`'s own (1 and
    3; vLLM's are 5 and 5): a dict naming no size builds what `SpecConfig(**dict)` builds."""
    lo, hi = kw.pop("prompt_lookup_min", None), kw.pop("prompt_lookup_max", None)
    if lo is None and hi is not None:
        lo = 1 if v0 else hi
    elif hi is None:
        hi = lo
    kw.update({k: v for k, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)) if v is not None})


@dataclass(frozen=True)
class SpecConfig:
    """What to speculate with and how K is chosen (vLLM `speculative_config` names).

    method: "draft_model" (a smaller model sharing the tokenizer), "eagle3" (an EAGLE-3
        head fed by the target's hidden states), "ngram" (prompt lookup), "suffix" (lookup
        over the slot's, its siblings' and earlier rollouts' tokens), "none" (plain
        decoding; `num_speculative_tokens` is forced to 0), or a
        method added with `dsd_jax.drafters.register`.
    model: draft model path (informational for "draft_model": the engine receives the
        model itself). For "eagle3": "builtin" or an EAGLE-3 head directory, checked to
        exist; `SpecEngine` loads it when no `draft=` is given (or pass
        `dsd_jax.models.load_eagle3(spec.model)` as `draft=`).
    num_speculative_tokens: max K (1..64, `MAX_SPECULATIVE_TOKENS`, unless method is "none").
    num_speculative_tokens_per_batch_size: inclusive [start_bs, end_bs, K] ranges,
        sorted, non-overlapping, start_bs >= 1, 0 <= K <= max K. Batch sizes no
        range covers use K = 0.
    disable_by_batch_size: K = 0 whenever the live batch size is >= this (as vLLM V0).
        For both, on a "data" mesh the batch size is the fullest data shard's live
        requests (what one step runs, as one vLLM data-parallel rank), not the total.
    acceptance: "rejection" (Leviathan et al.) or "drafter_invariant" (Gumbel-max
        coupling: output token-identical to plain sampling with the same seed).
    draft_sampling: "sample" (draft samples from q) or "argmax" (one-hot q); under
        "drafter_invariant" the draft always uses the coupled noise, so "argmax" is
        ignored there (with a warning).
    prompt_lookup_min / prompt_lookup_max: n-gram sizes for methods "ngram" and "suffix";
        prompt_lookup_max <= 64 (`MAX_PROMPT_LOOKUP`: compile time grows with its square).
    suffix_bank_len: tokens of references each slot holds for method "suffix" (earlier
        rollouts of its prompt; the last `suffix_bank_len` tokens of them, newest last, kept;
        at most 2**20).
    dynamic: `DynamicConfig` (or a dict of its fields) -> goodput controller (not with
        method "none", which has no K to choose).
    """

    method: str = "draft_model"
    model: str | None = None
    num_speculative_tokens: int = 4
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    disable_by_batch_size: int | None = None
    acceptance: str = "rejection"
    draft_sampling: str = "sample"
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    suffix_bank_len: int = 1024
    dynamic: DynamicConfig | None = None

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        method = _choice("method", self.method, drafters.names())  # built-in or registered
        set_("model", _opt_str("model", self.model))
        if method == "eagle3" and self.model not in (None, "builtin") and not os.path.isdir(self.model):
            raise ValueError(f"model for method 'eagle3' must be 'builtin' or an EAGLE-3 head "
                             f"directory (config.json + model.safetensors), got {self.model!r}")
        n = _int("num_speculative_tokens", self.num_speculative_tokens, min_value=0)
        if n > MAX_SPECULATIVE_TOKENS and method != "none":
            raise ValueError(f"num_speculative_tokens must be <= {MAX_SPECULATIVE_TOKENS}, got {n}: "
                             f"a step program is compiled for every K up to it")
        if method == "none":
            n = 0  # plain decoding: max K is 0 whatever was written
        elif n == 0:
            raise ValueError(
                f"num_speculative_tokens must be >= 1 for method {method!r} (use method='none' for plain decoding)"
            )
        set_("num_speculative_tokens", n)
        set_("num_speculative_tokens_per_batch_size", _schedule(self.num_speculative_tokens_per_batch_size, n))
        set_("disable_by_batch_size", _int("disable_by_batch_size", self.disable_by_batch_size, min_value=1,
                                           allow_none=True))
        _choice("acceptance", self.acceptance, ACCEPTANCE_MODES)
        _choice("draft_sampling", self.draft_sampling, DRAFT_SAMPLING_MODES)
        lo = _int("prompt_lookup_min", self.prompt_lookup_min, min_value=1)
        hi = _int("prompt_lookup_max", self.prompt_lookup_max, min_value=1)
        if hi > MAX_PROMPT_LOOKUP:
            raise ValueError(
                f"prompt_lookup_max must be <= {MAX_PROMPT_LOOKUP}, got {hi}: each n unrolls a compare "
                f"over the whole token buffer in every step program, so compile time grows with n^2, "
                f"and n-grams that long almost never match"
            )
        if lo > hi:
            raise ValueError(f"prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
        set_("prompt_lookup_min", lo)
        set_("prompt_lookup_max", hi)
        bank = _int("suffix_bank_len", self.suffix_bank_len, min_value=1)
        if bank > MAX_SUFFIX_BANK_LEN:
            raise ValueError(f"suffix_bank_len must be <= {MAX_SUFFIX_BANK_LEN}, got {bank}: every "
                             f"slot holds that many reference tokens on the device")
        set_("suffix_bank_len", bank)
        dyn = self.dynamic
        if dyn is not None and not isinstance(dyn, DynamicConfig):
            dyn = DynamicConfig.from_dict(dyn)
        set_("dynamic", dyn)
        if dyn is not None and method == "none":
            raise ValueError("dynamic has no K to choose with method 'none' (plain decoding): "
                             "drop dynamic, or pick a drafter method")
        if self.acceptance == "drafter_invariant" and self.draft_sampling == "argmax":
            warnings.warn("draft_sampling='argmax' is ignored under acceptance='drafter_invariant': "
                          "the draft samples with the target's Gumbel noise (the coupling that makes "
                          "output drafter-invariant)", UserWarning, stacklevel=3)
        if dyn is not None and self.num_speculative_tokens_per_batch_size is not None:
            raise ValueError(
                "dynamic and num_speculative_tokens_per_batch_size are mutually exclusive: "
                "give a per-batch-size schedule or a goodput controller, not both"
            )

    # ------------------------------------------------------------------ properties

    @property
    def max_k(self) -> int:
        """Largest K any step may use (0 for method "none")."""
        return self.num_speculative_tokens

    @property
    def controller_mode(self) -> str:
        """"none" | "static" | "schedule" | "goodput" (see the module docstring)."""
        if self.method == "none":
            return "none"
        if self.dynamic is not None:
            return "goodput"
        if self.num_speculative_tokens_per_batch_size is not None:
            return "schedule"
        return "static"

    def schedule_k(self, batch_size: int) -> int:
        """K the schedule / static rule gives for a live batch size (no goodput).

        Includes `disable_by_batch_size`. Not the hot path: the controller
        precomputes this per batch size.
        """
        if self.method == "none" or batch_size <= 0:
            return 0
        if self.disable_by_batch_size is not None and batch_size >= self.disable_by_batch_size:
            return 0
        sched = self.num_speculative_tokens_per_batch_size
        if sched is None:
            return self.num_speculative_tokens
        for s, t, k in sched:
            if s <= batch_size <= t:
                return k
        return 0  # not covered by any range

    # ------------------------------------------------------------------ (de)serialisation

    _FIELDS = (
        "method",
        "model",
        "num_speculative_tokens",
        "num_speculative_tokens_per_batch_size",
        "disable_by_batch_size",
        "acceptance",
        "draft_sampling",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "suffix_bank_len",
        "dynamic",
    )

    @classmethod
    def from_dict(cls, d: Any) -> "SpecConfig":
        """Build from a vLLM-style `speculative_config` dict.

        Accepts `speculative_disable_by_batch_size`, `speculative_model`,
        `num_speculative_tokens_per_bs` and vLLM V0's `ngram_prompt_lookup_max/min` as
        aliases, and V0's model "[ngram]" as method "ngram";
        `"method": null` (or no method) means "draft_model". N-gram sizes as vLLM fills
        them (`_fill_lookup_sizes`: one bound given is both; with neither, ours). Unknown
        keys are errors.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"speculative config must be a dict, got {_show(d)}")
        for k in d:
            if not isinstance(k, str):
                raise ValueError(f"unknown key in speculative config: {k!r} (keys must be strings)")
        known = set(cls._FIELDS) | set(_KEY_ALIASES)
        _reject_unknown("speculative config", d, known)
        kw: dict[str, Any] = {}
        given: dict[str, str] = {}  # field -> the key that gave it
        for k, v in d.items():
            canon = _KEY_ALIASES.get(k, k)
            if canon in kw and not _same_value(kw[canon], v):
                raise ValueError(f"{given[canon]!r} and {k!r} are aliases but were given different values")
            kw[canon] = v
            given[canon] = k
        if "method" in kw and kw["method"] is None:
            del kw["method"]
        if kw.get("method") == NGRAM_MODEL:  # vLLM's spelling of "ngram" too
            kw["method"] = "ngram"
        if kw.get("model") == NGRAM_MODEL:  # vLLM V0: prompt lookup, not a model path
            if kw.get("method", "ngram") != "ngram":
                raise ValueError(f"model {NGRAM_MODEL!r} means method 'ngram' (vLLM V0), but "
                                 f"method {kw['method']!r} was given")
            del kw["model"]
            kw["method"] = "ngram"
        _fill_lookup_sizes(kw, v0=any(k.startswith("ngram_prompt_lookup") for k in d))
        if "dynamic" in kw and kw["dynamic"] is not None and not isinstance(kw["dynamic"], Mapping):
            raise ValueError(f"dynamic must be a dict (or null), got {_show(kw['dynamic'])}")
        return cls(**kw)

    @classmethod
    def from_json(cls, src: str | os.PathLike) -> "SpecConfig":
        """From JSON text (a string starting with '{') or a path to a JSON file."""
        return cls.from_dict(read_json_config(src))

    def to_dict(self) -> dict:
        """JSON-ready dict with canonical keys; `from_dict(to_dict())` == self."""
        out: dict[str, Any] = {}
        for k in self._FIELDS:
            v = getattr(self, k)
            if k == "num_speculative_tokens_per_batch_size" and v is not None:
                v = [list(e) for e in v]
            elif k == "dynamic" and v is not None:
                v = v.to_dict()
            out[k] = v
        return out

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def replace(self, **changes) -> "SpecConfig":
        return dataclasses.replace(self, **changes)
