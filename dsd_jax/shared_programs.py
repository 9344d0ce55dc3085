"""Compiled programs shared by the engines alive in one process.

Two engines of the same structure (target graph, drafter, step options, the shapes,
dtypes and shardings of their params and state, buckets, mesh, matmul precision) compile
the same programs: what else differs between them (their weights, controllers,
`share_prefixes`, tokenizers) is a program argument or host-side. `Programs` hands one
engine's compiled program to the other instead of tracing, lowering and compiling it
again (a step of the tests' tiny pair on 2 cores: ~1.2 s to trace and lower, ~2.5 s to
compile, ~0.35 s from the persistent cache), and the two hold one copy of its code (one
set of XLA:CPU's memory maps, `map_budget`).

The table holds its programs weakly: a program lives as long as some engine holds it, so
dropping every engine that compiled it frees it, as before. Its key is `Programs`'
structure key, the program's own key and JAX's tracing context (`jax_config.trace_context`:
the flags that change what a trace produces). Only drafters whose class declares
`Drafter.shares_programs` (programs that read nothing of it but its type and fields) are
shared; a user's drafter compiles its own unless it says so. `not_shared()` turns sharing
off for a while (code patched at run time, or a run that must compile its own programs).
"""

from __future__ import annotations

import contextlib
import threading
import weakref

from jax._src import config as jax_config

_table: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_lock = threading.Lock()
_off = 0  # how many not_shared() blocks are open


def tracing_context() -> tuple:
    """JAX's flags that change what tracing produces, as jit's own cache keys them."""
    return jax_config.trace_context()


def get(key):
    """The program compiled under `key` that an engine still holds, or None."""
    with _lock:
        return None if _off else _table.get(key)


def put(key, program) -> None:
    with _lock:
        if not _off:
            _table[key] = program


def held() -> int:
    """How many shared programs are alive."""
    with _lock:
        return len(_table)


def clear() -> None:
    """Forgets every program (engines keep theirs): later engines compile their own."""
    with _lock:
        _table.clear()


@contextlib.contextmanager
def not_shared():
    """Inside: engines neither take programs from the table nor put theirs in, in any thread
    (what the code compiles may differ from what the table's programs were built from)."""
    global _off
    with _lock:
        _off += 1
    try:
        yield
    finally:
        with _lock:
            _off -= 1
