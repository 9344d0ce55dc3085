"""Paired B=1 greedy plain decoding: the floor, the engine whose first dispatch after the
prefill runs as many rounds as the rest (old) and the engine whose first dispatch after
a prefill runs one round (new: its rounds' times include the prefill).

    PYTHONPATH=../greedy_shortcut python ab.py REPS
"""
import sys

from paired import interleave, medians_ms, speed

from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts, make_floor
from dsd_jax.config import SpecConfig
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


def engine(cls):
    e = cls(target, None, SpecConfig(method="none"), max_batch_size=1, max_seq_len=256, tokenizer=tok,
            batch_buckets=[1])
    e.warmup()
    return e


old, new = engine(Old), engine(SpecEngine)
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"floor": lambda p: floor([p], 128)[0], "old": lambda p: old.generate([p], sp)[0].token_ids,
                "new": lambda p: new.generate([p], sp)[0].token_ids}, prompts, REPS)
print(f"B=1 128 tokens, {len(t['floor'])} paired calls; medians ms", medians_ms(t))
print("old speed / floor", speed(t["floor"], t["old"]))
print("new speed / floor", speed(t["floor"], t["new"]))
print("new speed / old", speed(t["old"], t["new"]))
