"""Where a result was measured: device, versions, commit, and paths fit to record.

Results are committed and shared, so they name files relative to the working directory
or the source tree (or by file name alone), never by a machine's absolute path."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # a checkout's root, or site-packages


def _git_dir() -> Path:
    git = SOURCE_ROOT / ".git"
    if git.is_file():  # a worktree: "gitdir: PATH"
        git = Path(git.read_text().split(":", 1)[1].strip())
    return git


def _git_commit() -> str | None:
    """HEAD commit of a source checkout, read from .git files (no subprocess); else None."""
    try:
        git = _git_dir()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head.split(":", 1)[1].strip()
        for base in (git, Path(str(git).split("/worktrees/")[0]) if "/worktrees/" in str(git) else git):
            p = base / ref
            if p.is_file():
                return p.read_text().strip()
            packed = base / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    except (OSError, IndexError, ValueError):
        pass
    return None


def _versions() -> dict:
    import jax
    try:
        import jaxlib
        jaxlib_version = getattr(jaxlib, "__version__", None)
    except ImportError:  # pragma: no cover
        jaxlib_version = None
    try:
        from importlib.metadata import version
        dsd_version = version("dsd-jax")
    except Exception:  # noqa: BLE001
        dsd_version = None
    return {"jax_version": jax.__version__, "jaxlib_version": jaxlib_version, "dsd_jax_version": dsd_version}


def environment() -> dict:
    import jax
    dev = jax.devices()[0]
    return {
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "num_devices": jax.device_count(),
        **_versions(),
        "commit": _git_commit(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def portable_path(path: str | os.PathLike) -> str:
    """`path` relative to the working directory or the source tree when inside one, else its
    file name."""
    p = Path(path).resolve()
    for base in (Path.cwd().resolve(), SOURCE_ROOT):
        if base != Path(base.anchor) and p.is_relative_to(base):
            return p.relative_to(base).as_posix()
    return p.name


def file_sha256(path: str | os.PathLike) -> str | None:
    """The first 16 hex digits of the file's SHA-256: identifies it wherever it lies."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None
