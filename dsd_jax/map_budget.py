"""Keeps XLA:CPU from crashing the process at the kernel's memory-map limit.

XLA:CPU maps each compiled kernel's code, read-only data and data separately, about three
memory mappings per kernel. A step of the built-in pair holds ~420 kernels, ~1150 maps at
K = 3 (~490 at K = 0); a prefill takes ~230. Linux caps a process at `vm.max_map_count`
mappings (65530 by default). The compile that crosses the cap fails in LLVM ("Cannot
allocate memory") and the process dies of a segmentation fault: measured with the cap
lowered to 3000, exit code 139, no Python exception. That takes a notebook's kernel or a
trainer down with it. The full CPU bench (two engines: 56 steps, their prefills and the
rest) holds 69,793 maps once compiled, and died this way on 2026-11-30.

So on a CPU, before each compile, `MapBudget.check` compares what the programs about to
compile are likely to take with what the cap leaves. It raises `MapLimitError`, saying
what to change, instead of letting the compile crash. A program is expected to take as
many maps as the most its kind took so far in this process (a step, per K). A kind not
seen yet is expected to take the most any program took, or `DEFAULT_MAPS` before the
first. `Programs.compile_all` compiles one program of each other kind first and checks
everything left once a step has been measured, so a warm-up that cannot fit fails within
its first programs, not after minutes (the full bench at the default cap: after 6.5 min
of compiling when only single programs were checked). Freed programs give their maps back
(an engine garbage-collected releases its own). The check applies only where the cap and
the count can be read (Linux); elsewhere `limit` is None and nothing is checked.
"""

from __future__ import annotations

from typing import Iterable

DEFAULT_MAPS = 1500  # a first program's expected maps: above the built-in pair's K = 3 step (~1150)
LIMIT_FILE = "/proc/sys/vm/max_map_count"
MAPS_FILE = "/proc/self/maps"


class MapLimitError(RuntimeError):
    """Compiling would cross the process's memory-map limit, where XLA:CPU crashes."""


def _read_limit() -> int | None:
    try:
        with open(LIMIT_FILE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def maps_in_use() -> int:
    """The memory mappings this process holds now (lines of /proc/self/maps)."""
    with open(MAPS_FILE, "rb") as f:
        return f.read().count(b"\n")


def _kind(key: tuple) -> tuple:
    """What a program's maps depend on: ("step", K) for a step (its bucket barely matters),
    else (its program's name,)."""
    return key[:2] if key[0] == "step" else key[:1]


class MapBudget:
    """The memory maps one process's programs take (module docstring). `limit` is None
    where the cap cannot be read: then `check` passes and `measure` does nothing."""

    def __init__(self, limit: int | None = None):
        self.limit = _read_limit() if limit is None else limit
        self.per_program: dict[tuple, int] = {}  # `_kind` -> the most maps one program of it took

    def estimate(self, key: tuple) -> int:
        """The maps program `key` (`Programs`' key: ("step", K, bucket), ("prefill", n, c),
        ...) is expected to take: the most its kind took, else (a K not compiled yet) the
        most any step took, else the most any program took, else `DEFAULT_MAPS`."""
        kind = _kind(key)
        if kind in self.per_program:
            return self.per_program[kind]
        steps = [n for k, n in self.per_program.items() if k[0] == "step"]
        return max(steps if steps and key[0] == "step" else self.per_program.values(), default=DEFAULT_MAPS)

    def measured_a_step(self) -> bool:
        return any(kind[0] == "step" for kind in self.per_program)

    def check(self, keys: Iterable[tuple], what: str) -> int | None:
        """Raises `MapLimitError` when compiling `keys` would likely cross the limit; `what`
        names them in the message. Returns the maps held now, for `measure` after the
        compile (None where nothing is counted)."""
        if self.limit is None:
            return None
        need, in_use = sum(self.estimate(k) for k in keys), maps_in_use()
        if in_use + need <= self.limit:
            return in_use
        raise MapLimitError(
            f"compiling {what} needs about {need} more memory maps, and this process holds {in_use} "
            f"of the {self.limit} the system allows (vm.max_map_count). XLA:CPU maps each compiled "
            "kernel on its own (about 1150 maps for a step program), and the compile that "
            "crosses the limit crashes the process. Raise the limit (as root: sysctl -w "
            "vm.max_map_count=262144), compile fewer programs (fewer batch_buckets, a smaller "
            "num_speculative_tokens, a smaller prefill_chunk), or free other engines first.")

    def measure(self, key: tuple, before: int | None) -> None:
        """Records what program `key` took: the maps held now less `before` (what `check`
        returned before it compiled; None: nothing to record). Programs freed meanwhile
        make it read low: the most a kind took is kept, and a reading of 0 or less is not
        recorded."""
        taken = None if before is None else maps_in_use() - before
        if taken is None or taken <= 0:  # (nothing counted, or other programs freed meanwhile)
            return
        kind = _kind(key)
        self.per_program[kind] = max(self.per_program.get(kind, 0), taken)
