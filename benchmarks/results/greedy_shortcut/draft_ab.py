"""Paired greedy, static K: the engine with the draft model's old proposal tail vs its
greedy shortcut. Reproduces at 4e95a80 only (it patches `DraftModel._propose_one`, which
4b3a740 replaced by `drafters.base.sample_proposal`):

    git show cf29d34:dsd_jax/drafters/draft_model.py > /tmp/old_draft_model.py
    python draft_ab.py K REPS [B] [OLD_FILE]
"""
import importlib.util
import sys

from paired import interleave, medians_ms, speed

from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.drafters import draft_model as dm
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams

K, REPS = int(sys.argv[1]), int(sys.argv[2])
B = int(sys.argv[3]) if len(sys.argv) > 3 else 1
spec = importlib.util.spec_from_file_location("old_dm", sys.argv[4] if len(sys.argv) > 4 else "/tmp/old_draft_model.py")
old = importlib.util.module_from_spec(spec)
sys.modules["old_dm"] = old
spec.loader.exec_module(old)

target, draft, tok = models.builtin()
prompts = [p[:64] for p in builtin_prompts(4 * B, 0, tok)[0]]
groups = [prompts[i * B:(i + 1) * B] for i in range(4)]


def engine():
    e = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=K),
                   max_batch_size=B, max_seq_len=256, tokenizer=tok, batch_buckets=[B])
    e.warmup()
    return e


new_fn, dm.DraftModel._propose_one = dm.DraftModel._propose_one, old.DraftModel._propose_one
a = engine()
dm.DraftModel._propose_one = new_fn
b = engine()
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"old": lambda g: [o.token_ids for o in a.generate(g, sp)],
                "new": lambda g: [o.token_ids for o in b.generate(g, sp)]}, groups, REPS)
print(f"K={K} B={B} medians ms", medians_ms(t))
print("new speed / old", speed(t["old"], t["new"]))
