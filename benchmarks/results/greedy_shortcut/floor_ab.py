"""Paired B=1 greedy plain decoding: the floor vs the engine at max_seq_len 256 and 4096.

    python floor_ab.py REPS
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


def engine(S):
    e = SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=1, max_seq_len=S, tokenizer=tok,
                   batch_buckets=[1])
    e.warmup()
    return e


a, b = engine(256), engine(4096)
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"floor": lambda p: floor([p], 128)[0], "S256": lambda p: a.generate([p], sp)[0].token_ids,
                "S4096": lambda p: b.generate([p], sp)[0].token_ids}, prompts, REPS)
print(f"B=1 128 tokens, {len(t['floor'])} paired calls; medians ms", medians_ms(t))
print("engine S=256 speed / floor", speed(t["floor"], t["S256"]))
print("engine S=4096 speed / floor", speed(t["floor"], t["S4096"]))
print("engine S=4096 speed / S=256", speed(t["S256"], t["S4096"]))
