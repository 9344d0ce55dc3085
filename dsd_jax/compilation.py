"""Counts XLA backend compilations (tests and the engine prove warm-up covers everything)."""

from __future__ import annotations

import threading

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_count = 0


def _on_duration(event: str, duration: float, **kwargs) -> None:
    global _count
    if event == _BACKEND_COMPILE_EVENT:
        with _lock:
            _count += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def compilation_count() -> int:
    """Programs the backend built in this process so far: XLA compilations and loads
    from the persistent compilation cache alike (JAX reports both as one event), so
    "no change after warm-up" means no program was built at all."""
    return _count


def enable_persistent_cache(directory: str) -> None:
    """Caches compiled programs on disk so the second start skips XLA compilation.

    JAX's cache key includes the cache's path (an XLA autotuning folder inside it is a
    compile option), so processes share entries only under one spelling of the path: it is
    made absolute, with symbolic links resolved (the test suite's two workers, a folder
    each, had none of their ~2200 entries each in common)."""
    import os
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise ValueError(f"compilation cache directory must be a path, got {directory!r}")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:  # a parent that is a file, a place no directory can be made (/proc)
        raise ValueError(f"cannot make the compilation cache directory {os.fspath(directory)!r}: "
                         f"{e.strerror or e}") from e
    jax.config.update("jax_compilation_cache_dir", os.path.realpath(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
