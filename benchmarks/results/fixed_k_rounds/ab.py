"""Paired B=1 greedy plain decoding: the floor, the engine as it was (three equal K choices
before a dispatch may run several rounds) and as it is (a fixed-K controller is stable at once).

    PYTHONPATH=../greedy_shortcut python ab.py REPS

Ran on 682c01f plus the stable-at-once rule alone (MAX_ROUNDS 8); `SpecEngine._rounds` has
since taken the batch and context too.
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


class OldRounds(SpecEngine):
    """The rule before: every controller waits for three equal choices."""

    def _rounds(self, live, k, queued, inflight):
        mode = self.controller.mode
        self.controller.mode, max_k = "goodput", self.max_k
        self.max_k = max(max_k, 1)
        try:
            return super()._rounds(live, k, queued, inflight)
        finally:
            self.controller.mode, self.max_k = mode, max_k


def engine(cls):
    e = cls(target, None, SpecConfig(method="none"), max_batch_size=1, max_seq_len=256, tokenizer=tok,
            batch_buckets=[1])
    e.warmup()
    return e


old, new = engine(OldRounds), engine(SpecEngine)
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"floor": lambda p: floor([p], 128)[0], "old": lambda p: old.generate([p], sp)[0].token_ids,
                "new": lambda p: new.generate([p], sp)[0].token_ids}, prompts, REPS)
print(f"B=1 128 tokens, {len(t['floor'])} paired calls; medians ms", medians_ms(t))
print("old speed / floor", speed(t["floor"], t["old"]))
print("new speed / floor", speed(t["floor"], t["new"]))
print("new speed / old", speed(t["old"], t["new"]))
