"""Paired B=1 greedy plain decoding: the floor, the engine whose first dispatch after the
prefill runs as many rounds as the rest (old) and the engine whose first dispatch after
a prefill runs one round (new: its rounds' times include the prefill).

    PYTHONPATH=../greedy_shortcut python ab.py REPS
"""
import sys

from paired import interleave, plain_engine, report

from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts, make_floor
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams

REPS = int(sys.argv[1])
target, draft, tok = models.builtin()
prompts = [p[:64] for p in builtin_prompts(4, 0, tok)[0]]
floor = make_floor(target, 64)


class Old(SpecEngine):
    """The rule before: a prefill does not shorten the dispatch behind it."""

    def _rounds(self, *args):
        prefilled, self._prefilled = self._prefilled, False
        try:
            return super()._rounds(*args)
        finally:
            self._prefilled = prefilled


old, new = plain_engine(Old, target, tok, 256), plain_engine(SpecEngine, target, tok, 256)
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"floor": lambda p: floor([p], 128)[0], "old": lambda p: old.generate([p], sp)[0].token_ids,
                "new": lambda p: new.generate([p], sp)[0].token_ids}, prompts, REPS)
report(t, "B=1 128 tokens", [("old speed / floor", "old", "floor"), ("new speed / floor", "new", "floor"),
                             ("new speed / old", "new", "old")])
