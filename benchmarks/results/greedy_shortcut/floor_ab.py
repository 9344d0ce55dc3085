"""Paired B=1 greedy plain decoding: the floor vs the engine at max_seq_len 256 and 4096.

    python floor_ab.py REPS
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


a, b = plain_engine(SpecEngine, target, tok, 256), plain_engine(SpecEngine, target, tok, 4096)
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"floor": lambda p: floor([p], 128)[0], "S256": lambda p: a.generate([p], sp)[0].token_ids,
                "S4096": lambda p: b.generate([p], sp)[0].token_ids}, prompts, REPS)
report(t, "B=1 128 tokens", [("engine S=256 speed / floor", "S256", "floor"),
                             ("engine S=4096 speed / floor", "S4096", "floor"),
                             ("engine S=4096 speed / S=256", "S4096", "S256")])
