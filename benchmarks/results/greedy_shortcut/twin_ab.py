"""Two identical plain-decoding engines in one process, paired and interleaved: how far
apart can two instances of the same configuration run? (A floor under what a paired
bench between two engines resolves.)

    python twin_ab.py B REPS
"""
import sys

from paired import interleave, medians_ms, speed

from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams

B, REPS = int(sys.argv[1]), int(sys.argv[2])
target, draft, tok = models.builtin()
prompts = [p[:64] for p in builtin_prompts(2 * B, 0, tok)[0]]
groups = [prompts[:B], prompts[B:]]


def engine():
    e = SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=B, max_seq_len=256, tokenizer=tok,
                   batch_buckets=[B])
    e.warmup()
    return e


a, b = engine(), engine()
sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)  # as before the engine stopped at eos
t = interleave({"a": lambda g: [o.token_ids for o in a.generate(g, sp)],
                "b": lambda g: [o.token_ids for o in b.generate(g, sp)]}, groups, REPS)
print(f"B={B}: {len(t['a'])} pairs, medians ms {medians_ms(t)}; speed b / a {speed(t['a'], t['b'])}")
