"""The controller keeps exploring where its estimates could be stuck, and cheaply.

Seeded simulations against the real `Controller`, one per finding of the controller
audit: drafts a held K never proposes (or stopped proposing), ... Step times are the
profile's ITL; nothing here is timed.
"""

import numpy as np
import pytest

from dsd_jax.controller import Controller
from test_controller import goodput_spec, realistic_profile

PROF = realistic_profile()  # acceptance 0.8, 0.65, 0.5, 0.4, 0.3, 0.25; max K 6


def _queue(c, b, steps, accept):
    """`steps` one-round dispatches at batch size b (a queue refills every row);
    accept(step, k) -> drafts accepted per row. Returns the K of each step."""
    ks = []
    for s in range(steps):
        k = c.choose_k(b)
        c.observe(k, accept(s, k) if k else [0] * b, PROF.itl_ms(b, k) / 1e3)
        ks.append(k)
    return ks


# ---------------------------------------------------------------- drafts above the held K


@pytest.mark.parametrize("b", [1, 4, 16])
def test_a_held_k_whose_drafts_are_all_accepted_tries_more(b):
    """Every draft accepted: K = 6 is the fastest at B = 1-16 (AL = K + 1). The drafts above
    the held K are never proposed; at the profile's rates there K = 4 (B=1), 3 (B=4) or
    1 (B=16) was held for good. At least the last live rate there: K = 6."""
    c = Controller(goodput_spec(objective="throughput"), PROF, max_batch_size=64)
    _queue(c, b, 300, lambda s, k: [k] * b)
    assert c.current_k == 6


@pytest.mark.parametrize("b", [1, 4])
def test_rates_left_by_a_hard_stretch_fade_once_their_drafts_are_not_proposed(b):
    """200 steps accepting the first draft only, then every draft. The first stretch left
    rates of 0 at drafts 2-6; held at K = 1, nothing proposed them again, and K = 1 was held
    for good (1.45x K = 6's time at B = 1). Their counts fade: K = 6 comes back."""
    c = Controller(goodput_spec(objective="throughput"), PROF, max_batch_size=64)
    ks = _queue(c, b, 600, lambda s, k: [min(k, 1) if s < 200 else k] * b)
    assert ks[199] == 1 and c.current_k == 6
