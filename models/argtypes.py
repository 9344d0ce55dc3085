"""argparse types for the command lines (`dsd-jax`, `python -m dsd_jax.models.train`,
`...train_eagle3`): a bad number is an error naming the flag, before any work."""

from __future__ import annotations

import argparse
import math


def int_at_least(lowest: int, what: str, highest: int | None = None):
    """An integer in [`lowest`, `highest`], else an error saying `what` was expected."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v < lowest or (highest is not None and v > highest):
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v
    return parse


def float_in(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False):
    """A finite float in [low, high] (open ends where asked)."""
    lo, hi = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
    what = f"a finite number in {lo}{low:g}, {high:g}{hi}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(v) and (v > low if low_open else v >= low)
                and (v < high if high_open else v <= high)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return v
    return parse


positive_int = int_at_least(1, "a positive integer")
nonneg_int = int_at_least(0, "an integer >= 0")
positive_float = float_in(0.0, low_open=True)
nonneg_float = float_in(0.0)
