"""Locating a greedy divergence and judging its top-2 gap (`dsd_jax.divergence`)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import oracle_logits
from dsd_jax.divergence import first_divergence, top2_gap, top2_gap_at


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # one a prefix of the other: where it ends
    assert first_divergence([], [4]) == 0


def test_top2_gap_at_is_the_full_forwards_gap(tiny_pair):
    target = tiny_pair[0]
    prompt, tokens = [3, 9, 4, 1], [7, 7, 2]
    got = top2_gap_at(target, prompt, tokens, 2)
    top = np.sort(np.asarray(oracle_logits(target, prompt + tokens[:2]), np.float64))[-2:]
    assert got["top2_gap"] == pytest.approx(top[1] - top[0], rel=1e-5, abs=1e-6)
    assert got["dtype"] == target.config.dtype and got["near_tie"] == top2_gap(top[1], top[0], "float32")["near_tie"]
    # one float32 ulp at a logit of 5.36 (bench_full_s27's prompt 372) is a near-tie; 1e-3 is not
    assert top2_gap(5.3563, 5.3563 - 2 ** -21, "float32")["gap_in_ulps"] == 1.0
    assert top2_gap(5.3563, 5.3563 - 2 ** -21, "float32")["near_tie"]
    assert not top2_gap(5.3563, 5.3553, "float32")["near_tie"]
