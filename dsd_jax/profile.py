"""Profile file: measured step latency ITL(context, B, K) and draft acceptance.

A versioned JSON document (``SCHEMA_VERSION``) written by the profiler and read by
the goodput controller. Every key below is always written (optional ones as
``null``/``{}``), so a file missing any key is rejected:

``schema_version`` (int), ``device_kind`` (str, e.g. ``"NVIDIA H100"``, ``"cpu"``),
``platform`` (str), ``jax_version`` (str), ``method`` (str), ``fingerprints``
(role -> str, e.g. ``{"target": "...", "draft": "..."}``), ``batch_sizes`` (strictly
increasing ints >= 1), ``ks`` (``[0, 1, ..., max_k]``), ``context_lengths`` (strictly
increasing ints >= 0, at least one), ``latency_ms`` (``[context][batch][k]`` positive
finite floats, milliseconds per step), ``acceptance`` (``a_1..a_max_k``),
``acceptance_by_temperature`` (null or ``{"<temperature>": [a_1..a_max_k]}``; with two or
more, the controller's prior for each run is the one closest to its requests' median
temperature, `Controller.use_temperature`),
``catchup_ms`` (null, or ``{"chunk": tokens, "ms": [per batch size]}``: what one
round of the drafter's catch-up adds to a step, `chunk` tokens a row, at each batch
size; null for drafters that never lag), ``created`` (ISO-8601 str), ``meta`` (free
dict). Version 1 files (written before ``catchup_ms``) still load, without it.

``a_i`` is the *unconditional* probability that draft position ``i`` is accepted in a
step that proposed at least ``i`` drafts, i.e. ``P(num_accepted >= i)``; it is
non-increasing in ``i`` and the expected tokens per step with K drafts is
``AL(K) = 1 + sum_{i<=K} a_i``.

Loading validates everything (missing cells, ragged tables, zero/NaN/inf latency,
acceptance outside [0, 1], unsorted axes, bad JSON) with a `ValueError` that names
the file and the problem; a fingerprint or device-kind mismatch emits a loud
`ProfileMismatchWarning`. This module does not import JAX: the profiler passes the
device kind and jax version in.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import json
import math
import numbers
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from dsd_jax.loading import atomic_write

__all__ = ["Profile", "ProfileMismatchWarning", "SCHEMA_VERSION"]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: no catchup_ms

_KEYS = (
    "schema_version",
    "device_kind",
    "platform",
    "jax_version",
    "method",
    "fingerprints",
    "batch_sizes",
    "ks",
    "context_lengths",
    "latency_ms",
    "acceptance",
    "acceptance_by_temperature",
    "catchup_ms",
    "created",
    "meta",
)
_KEYS_BY_VERSION = {2: _KEYS, 1: tuple(k for k in _KEYS if k != "catchup_ms")}


class ProfileMismatchWarning(UserWarning):
    """The profile was measured for another model or device than the one in use."""


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _axis(name: str, v: Any, min_value: int) -> list[int]:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple)) or len(v) == 0:
        raise ValueError(f"{name} must be a non-empty list of integers, got {type(v).__name__}")
    out = []
    for i, x in enumerate(v):
        if not _is_int(x):
            raise ValueError(f"{name}[{i}] must be an integer, got {x!r}")
        if x < min_value:
            raise ValueError(f"{name}[{i}] must be >= {min_value}, got {x}")
        out.append(int(x))
    for i in range(1, len(out)):
        if out[i] <= out[i - 1]:
            raise ValueError(f"{name} must be strictly increasing (sorted, no duplicates), got {out}")
    return out


def _acc_list(name: str, v: Any, n: int) -> list[float]:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{name} must be a list of {n} probabilities, got {type(v).__name__}")
    if len(v) != n:
        raise ValueError(f"{name} must have one entry per draft position 1..{n} (max K), got {len(v)}")
    out = []
    for i, x in enumerate(v):
        if not _is_real(x) or not math.isfinite(_f(x)) or not 0.0 <= _f(x) <= 1.0:
            raise ValueError(f"{name}[{i}] (position {i + 1}) must be a probability in [0, 1], got {x!r}")
        out.append(_f(x))
    check_nonincreasing(name, out)
    return out


def check_nonincreasing(name: str, acceptance: Sequence[float]) -> None:
    """a_i = P(accepted >= i) cannot grow with i; a curve that does would turn into
    conditional rates above 1 and AL(K) beyond K + 1 in the controller."""
    for i in range(1, len(acceptance)):
        if acceptance[i] > acceptance[i - 1] + 1e-9:
            raise ValueError(f"{name}: a_{i + 1} = {acceptance[i]!r} exceeds a_{i} = "
                             f"{acceptance[i - 1]!r}; a_i = P(accepted >= i) must not increase "
                             f"with the draft position i")


def _f(x: Any) -> float:
    """float(x) that maps overflow (a huge JSON integer) to inf instead of raising."""
    try:
        return float(x)
    except OverflowError:
        return math.inf


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{name} must be a string, got {type(v).__name__}")
    return v


def _interp_index(grid: Sequence[int], x: float) -> tuple[int, int, float]:
    """(i0, i1, w): value = (1-w) * v[i0] + w * v[i1], clamped outside the grid."""
    if x <= grid[0]:
        return 0, 0, 0.0
    if x >= grid[-1]:
        n = len(grid) - 1
        return n, n, 0.0
    j = bisect.bisect_right(grid, x) - 1
    return j, j + 1, (x - grid[j]) / (grid[j + 1] - grid[j])


def _real_arg(name: str, v: Any) -> float:
    if not _is_real(v) or not math.isfinite(_f(v)):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return _f(v)


@dataclass(eq=False)
class Profile:
    """Measured ITL table and acceptance; see the module docstring for the format.

    `latency_ms` may be given 2-D (``[batch][k]``) when `context_lengths` is None;
    it is then stored with a single context length of 0 ("unspecified"). Treat a
    Profile as immutable once built (the interpolation table is cached).
    """

    device_kind: str
    batch_sizes: list[int]
    ks: list[int]
    latency_ms: list
    acceptance: list[float]
    context_lengths: list[int] | None = None
    method: str = "draft_model"
    platform: str = ""
    jax_version: str = ""
    fingerprints: dict[str, str] = field(default_factory=dict)
    acceptance_by_temperature: dict[str, list[float]] | None = None
    catchup_ms: dict | None = None
    created: str = field(default_factory=_now_iso)
    meta: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        sv = self.schema_version
        if not _is_int(sv) or sv not in READABLE_VERSIONS:
            raise ValueError(f"schema_version must be one of {READABLE_VERSIONS}, got {sv!r}")
        self.schema_version = SCHEMA_VERSION  # a version 1 document is a version 2 one without catchup_ms
        self.device_kind = _str("device_kind", self.device_kind)
        self.platform = _str("platform", self.platform)
        self.jax_version = _str("jax_version", self.jax_version)
        self.method = _str("method", self.method)
        self.created = _str("created", self.created)
        if not isinstance(self.fingerprints, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.fingerprints.items()
        ):
            raise ValueError("fingerprints must be a dict of role (str) -> fingerprint (str)")
        self.fingerprints = dict(self.fingerprints)
        if not isinstance(self.meta, Mapping):
            raise ValueError(f"meta must be a dict, got {type(self.meta).__name__}")
        self.meta = dict(self.meta)

        self.batch_sizes = _axis("batch_sizes", self.batch_sizes, 1)
        self.ks = _axis("ks", self.ks, 0)
        if self.ks != list(range(len(self.ks))):
            raise ValueError(f"ks must be contiguous from 0 ([0, 1, ..., max_k]), got {self.ks}")
        lat = self.latency_ms
        if isinstance(lat, np.ndarray):
            lat = lat.tolist()
        if self.context_lengths is None:
            # 2-D convenience form: one (unspecified) context length.
            self.context_lengths = [0]
            lat = [lat]
        self.context_lengths = _axis("context_lengths", self.context_lengths, 0)
        self.latency_ms = self._check_latency(lat)
        self.acceptance = _acc_list("acceptance", self.acceptance, self.max_k)
        abt = self.acceptance_by_temperature
        if abt is not None:
            if not isinstance(abt, Mapping):
                raise ValueError("acceptance_by_temperature must be null or a dict temperature -> list")
            checked = {}
            for t, v in abt.items():
                try:
                    tf = float(t)
                except (TypeError, ValueError, OverflowError):
                    tf = float("nan")
                if isinstance(t, bool) or not math.isfinite(tf) or tf < 0:
                    raise ValueError(f"acceptance_by_temperature key {t!r} must be a temperature >= 0")
                checked[str(t)] = _acc_list(f"acceptance_by_temperature[{t!r}]", v, self.max_k)
            self.acceptance_by_temperature = checked
        self.catchup_ms = self._check_catchup(self.catchup_ms)
        # [context, batch, k] float64 table used by interpolation.
        self._table = np.asarray(self.latency_ms, dtype=np.float64)

    def _check_catchup(self, c: Any) -> dict | None:
        if c is None:
            return None
        if not isinstance(c, Mapping) or set(c) != {"chunk", "ms"}:
            raise ValueError(f'catchup_ms must be null or {{"chunk": tokens, "ms": [per batch size]}}, got {c!r}')
        chunk, ms = c["chunk"], c["ms"]
        if not _is_int(chunk) or chunk < 1:
            raise ValueError(f"catchup_ms.chunk must be a positive integer (tokens a row), got {chunk!r}")
        if isinstance(ms, np.ndarray):
            ms = ms.tolist()
        if not isinstance(ms, (list, tuple)) or len(ms) != len(self.batch_sizes):
            raise ValueError(f"catchup_ms.ms must have one entry per batch size ({len(self.batch_sizes)}), "
                             f"got {ms!r}")
        for i, x in enumerate(ms):
            if not _is_real(x) or not math.isfinite(_f(x)) or _f(x) < 0.0:
                raise ValueError(f"catchup_ms.ms[{i}] (batch {self.batch_sizes[i]}) must be a finite "
                                 f"number of ms >= 0, got {x!r}")
        return {"chunk": int(chunk), "ms": [_f(x) for x in ms]}

    def _check_latency(self, lat: Any) -> list:
        nc, nb, nk = len(self.context_lengths), len(self.batch_sizes), len(self.ks)

        def rows(name, v, n, what):
            if not isinstance(v, (list, tuple)):
                raise ValueError(f"{name} must be a list over {what}, got {type(v).__name__}")
            if len(v) != n:
                raise ValueError(
                    f"{name} has {len(v)} entries but there are {n} {what} (missing cells or ragged table)"
                )
            return v

        out = []
        for ci, crow in enumerate(rows("latency_ms", lat, nc, "context_lengths")):
            c_out = []
            for bi, brow in enumerate(rows(f"latency_ms[{ci}]", crow, nb, "batch_sizes")):
                b_out = []
                for ki, x in enumerate(rows(f"latency_ms[{ci}][{bi}]", brow, nk, "ks")):
                    where = (
                        f"latency_ms[{ci}][{bi}][{ki}] (context {self.context_lengths[ci]}, "
                        f"batch {self.batch_sizes[bi]}, K {self.ks[ki]})"
                    )
                    if not _is_real(x):
                        raise ValueError(f"{where} must be a number, got {x!r}")
                    xf = _f(x)
                    if not math.isfinite(xf) or xf <= 0.0:
                        raise ValueError(f"{where} must be a positive finite latency, got {xf}")
                    b_out.append(xf)
                c_out.append(b_out)
            out.append(c_out)
        return out

    # ------------------------------------------------------------------ queries

    @property
    def max_k(self) -> int:
        return self.ks[-1]

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def _context_slice(self, context_len: Any) -> np.ndarray:
        """[batch, k] table at a context length (linear interpolation, clamped)."""
        if context_len is None:
            return self._table[0]
        c = _real_arg("context_len", context_len)
        i0, i1, w = _interp_index(self.context_lengths, c)
        if w == 0.0:
            return self._table[i0]
        return (1.0 - w) * self._table[i0] + w * self._table[i1]

    def itl_ms(self, batch_size: float, k: int, context_len: float | None = None) -> float:
        """Step latency (ms) for K drafts at a batch size and context length.

        Linear over batch size and context length (exact at grid points), clamped
        outside the profiled range. `k` must be one of `ks`. `context_len=None`
        means the first profiled context length.
        """
        if not _is_int(k) or not 0 <= k <= self.max_k:
            raise ValueError(f"k must be an integer in the profile's ks {self.ks}, got {k!r}")
        b = _real_arg("batch_size", batch_size)
        i0, i1, w = _interp_index(self.batch_sizes, b)
        k = int(k)
        # the two cells `_context_slice` would give, without interpolating its whole table
        # (the controller asks for one cell a round): the same arithmetic, so the same bits
        if context_len is None:
            tab, nxt, wc = self._table[0], None, 0.0
        else:
            c0, c1, wc = _interp_index(self.context_lengths, _real_arg("context_len", context_len))
            tab, nxt = self._table[c0], self._table[c1]

        def cell(i):
            return tab[i, k] if wc == 0.0 else (1.0 - wc) * tab[i, k] + wc * nxt[i, k]

        if w == 0.0:
            return float(cell(i0))
        return float((1.0 - w) * cell(i0) + w * cell(i1))

    def itl_table(self, context_len: float | None = None, batch_sizes: Sequence[float] | None = None) -> np.ndarray:
        """ITL (ms) as an array [len(batch_sizes), len(ks)].

        `batch_sizes` defaults to 1..max profiled batch size. Same numbers as
        `itl_ms` (bitwise), computed vectorised for the controller's precompute.
        """
        if batch_sizes is None:
            batch_sizes = range(1, self.max_batch_size + 1)
        tab = self._context_slice(context_len)
        out = np.empty((len(batch_sizes), len(self.ks)), dtype=np.float64)
        for r, b in enumerate(batch_sizes):
            i0, i1, w = _interp_index(self.batch_sizes, _real_arg("batch_size", b))
            out[r] = tab[i0] if w == 0.0 else (1.0 - w) * tab[i0] + w * tab[i1]
        return out

    def acceptance_for(self, temperature: float | None = None) -> np.ndarray:
        """a_1..a_max_k: the profile's acceptance, or the closest measured temperature's."""
        if temperature is None or not self.acceptance_by_temperature:
            return np.asarray(self.acceptance, dtype=np.float64)
        t = _real_arg("temperature", temperature)
        key = min(self.acceptance_by_temperature, key=lambda s: abs(float(s) - t))
        return np.asarray(self.acceptance_by_temperature[key], dtype=np.float64)

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "device_kind": self.device_kind,
            "platform": self.platform,
            "jax_version": self.jax_version,
            "method": self.method,
            "fingerprints": dict(self.fingerprints),
            "batch_sizes": list(self.batch_sizes),
            "ks": list(self.ks),
            "context_lengths": list(self.context_lengths),
            "latency_ms": [[list(r) for r in c] for c in self.latency_ms],
            "acceptance": list(self.acceptance),
            "acceptance_by_temperature": (
                None if self.acceptance_by_temperature is None else {k: list(v) for k, v in
                                                                      self.acceptance_by_temperature.items()}
            ),
            "catchup_ms": None if self.catchup_ms is None else {"chunk": self.catchup_ms["chunk"],
                                                                "ms": list(self.catchup_ms["ms"])},
            "created": self.created,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "profile") -> "Profile":
        """Validate a parsed profile document (all keys required)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{source}: top level must be a JSON object, got {type(d).__name__}")
        if "schema_version" not in d:
            raise ValueError(f"{source}: missing schema_version (expected {SCHEMA_VERSION})")
        sv = d["schema_version"]
        if not _is_int(sv) or sv not in READABLE_VERSIONS:
            raise ValueError(
                f"{source}: unsupported schema_version {sv!r} (this dsd_jax reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}); re-run the profiler"
            )
        keys = _KEYS_BY_VERSION[sv]
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"{source}: missing key(s) {missing}")
        unknown = [k for k in d if k not in keys]
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown} (put free-form data under 'meta')")
        if d["context_lengths"] is None:
            raise ValueError(f"{source}: context_lengths must be a non-empty list of integers, got null")
        try:
            return cls(**{k: d[k] for k in keys})
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the JSON document (atomically: temp file + rename)."""
        def write(f):
            json.dump(self.to_dict(), f, indent=1, allow_nan=False)
            f.write("\n")
        atomic_write(path, write)

    def _engine_meta(self, key: str):
        """`meta["engine"][key]`, the engine the profile was measured with (None: not recorded)."""
        engine = self.meta.get("engine") if isinstance(self.meta, dict) else None
        return engine.get(key) if isinstance(engine, dict) else None

    @property
    def mesh(self) -> dict:
        """{"data": n, "model": m} the profile was measured on (one device when unrecorded)."""
        mesh = self._engine_meta("mesh")
        # an axis the file leaves out has size 1, as in `sharding.axis_sizes`
        return {"data": 1, "model": 1, **mesh} if isinstance(mesh, dict) else {"data": 1, "model": 1}

    @property
    def kernel_backends(self) -> dict | None:
        """{"attention": ..., "rejection": ...} the steps were timed with (None: not recorded)."""
        backends = self._engine_meta("kernel_backends")
        return dict(backends) if isinstance(backends, dict) else None

    @property
    def max_seq_len(self) -> int | None:
        """The engine max_seq_len the profile was measured at (None: not recorded)."""
        return self._engine_meta("max_seq_len")

    def fit_problems(self, max_k: int, max_batch_size: int, max_seq_len: int,
                     min_batch_size: int = 1) -> list[str]:
        """Ways this profile does not describe an engine with these limits (empty: it fits).
        `max_batch_size` / `min_batch_size` are the largest / smallest batch one step runs
        (per data shard: the engine's largest and smallest batch buckets)."""
        problems = []
        if self.batch_sizes[0] > min_batch_size:
            problems.append(f"the profile covers batch sizes from {self.batch_sizes[0]} but the engine runs "
                            f"from {min_batch_size}: smaller batches use the ITL of "
                            f"{self.batch_sizes[0]} (clamped)")
        if self.max_batch_size < max_batch_size:
            problems.append(f"the profile covers batch sizes up to {self.max_batch_size} but the engine runs up "
                            f"to {max_batch_size}: larger batches use the ITL of "
                            f"{self.max_batch_size} (clamped)")
        if self.max_k < max_k:
            problems.append(f"the profile covers K <= {self.max_k} but the engine allows K <= {max_k}: the "
                            f"controller never chooses K > {self.max_k}")
        if self.max_seq_len not in (None, max_seq_len):
            problems.append(f"the profile was measured with max_seq_len {self.max_seq_len}, the engine has "
                            f"{max_seq_len}: step latency follows the KV-cache size")
        return problems

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        expect_fingerprints: Mapping[str, str] | None = None,
        expect_device_kind: str | None = None,
        expect_mesh: Mapping[str, int] | None = None,
        expect_kernel_backends: Mapping[str, str] | None = None,
    ) -> "Profile":
        """Read and validate a profile file.

        Raises ValueError (naming the file) for unreadable/invalid JSON or any
        invalid content. Emits `ProfileMismatchWarning` when a fingerprint in
        `expect_fingerprints`, `expect_device_kind`, `expect_mesh` or `expect_kernel_backends`
        differs from the file's.
        """
        src = f"profile file {os.fspath(path)!r}"
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read {src}: {e}") from None
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"{src} is not valid JSON: {e}") from None
        prof = cls.from_dict(d, source=src)
        prof.check_compatible(expect_fingerprints, expect_device_kind, expect_mesh, source=src,
                              expect_kernel_backends=expect_kernel_backends)
        return prof

    def check_compatible(
        self,
        expect_fingerprints: Mapping[str, str] | None = None,
        expect_device_kind: str | None = None,
        expect_mesh: Mapping[str, int] | None = None,
        *,
        source: str = "profile",
        expect_kernel_backends: Mapping[str, str] | None = None,
    ) -> bool:
        """Warn (ProfileMismatchWarning) on model/device/mesh/kernel mismatch; True if all match
        (a profile that does not record its kernels is not checked for them)."""
        ok = True
        timed = self.kernel_backends
        if expect_kernel_backends is not None and timed is not None and dict(expect_kernel_backends) != timed:
            ok = False
            warnings.warn(
                f"{source} was timed with kernels {timed} but this run uses {dict(expect_kernel_backends)}: "
                "a step's latency depends on them; re-run the profiler",
                ProfileMismatchWarning,
                stacklevel=3,
            )
        if expect_mesh is not None and dict(expect_mesh) != self.mesh:
            ok = False
            warnings.warn(
                f"{source} was measured on mesh {self.mesh} but this run uses {dict(expect_mesh)}: "
                "a step's latency depends on how the work is split; re-run the profiler",
                ProfileMismatchWarning,
                stacklevel=3,
            )
        if expect_fingerprints is not None and not isinstance(expect_fingerprints, Mapping):
            raise ValueError(f"expect_fingerprints must be a dict role -> fingerprint, got {expect_fingerprints!r}")
        if expect_device_kind is not None and expect_device_kind != self.device_kind:
            ok = False
            warnings.warn(
                f"{source} was measured on device kind {self.device_kind!r} but this run uses "
                f"{expect_device_kind!r}: its latencies (and so the chosen K) may be wrong; re-run the profiler",
                ProfileMismatchWarning,
                stacklevel=3,
            )
        for role, want in (expect_fingerprints or {}).items():
            have = self.fingerprints.get(role)
            if have != want:
                ok = False
                shown = "no such fingerprint" if have is None else repr(have)
                warnings.warn(
                    f"{source}: {role!r} model fingerprint mismatch: profile has {shown}, this run uses "
                    f"{want!r}; latencies and acceptance were measured for another model; re-run the profiler",
                    ProfileMismatchWarning,
                    stacklevel=3,
                )
        return ok
