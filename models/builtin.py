"""The built-in target/draft pair, trained on the CPython standard library by
`python -m dsd_jax.models.train` and shipped with the package (no network needed).

    target, draft, tokenizer = dsd_jax.models.builtin()

`tokenizer` is a `tokenizers.Tokenizer` (byte-level BPE, vocab 4096, `<|endoftext|>`
= id 0). Evaluation numbers are in `builtin/EVAL.json` (`python -m dsd_jax.models.evaluate`).
"""

from __future__ import annotations

from pathlib import Path

from . import corpus
from .checkpoint import restore

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
EOT_ID = 0


def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"built-in model file {path} is missing; reinstall dsd-jax or retrain with "
            f"`python -m dsd_jax.models.train --out DIR` and copy DIR/{{target,draft,tokenizer.json}} there")
    return path


def _load_tokenizer(path: str | Path | None = None):
    from tokenizers import Tokenizer
    path = Path(path) if path is not None else BUILTIN_DIR / "tokenizer.json"
    return Tokenizer.from_file(str(_require(path)))


def builtin(dtype: str = "float32", path: str | Path | None = None):
    """Returns `(target, draft, tokenizer)`: the shipped checkpoints (stored in bf16),
    cast to `dtype` ("float32" or "bfloat16")."""
    root = Path(path) if path is not None else BUILTIN_DIR
    target = restore(_require(root / "target"), dtype=dtype)
    draft = restore(_require(root / "draft"), dtype=dtype)
    return target, draft, _load_tokenizer(root / "tokenizer.json")


def heldout_prompts(n: int = 16, num_lines: int = 8, seed: int = 0) -> list[str]:
    """`n` code prompts (heads of functions/classes) from standard-library modules the
    built-in models never saw in training; reproducible for a given seed."""
    return corpus.heldout_prompts(n, num_lines=num_lines, seed=seed)
