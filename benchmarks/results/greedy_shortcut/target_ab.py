"""Paired B=1 greedy: the floor (`side_by_side.make_floor`) vs the engine with an old
`step.spec_step` vs the engine as it is (the target's greedy shortcut).

    git show 794cd7e:dsd_jax/step.py > /tmp/old_step.py
    python target_ab.py MAX_SEQ_LEN REPS [METHOD] [OLD_STEP_FILE]
"""
import importlib.util
import sys

from paired import interleave, medians_ms, speed

import dsd_jax.step as step_mod
from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts, make_floor
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams

S, REPS = int(sys.argv[1]), int(sys.argv[2])
METHOD = sys.argv[3] if len(sys.argv) > 3 else "none"
spec = importlib.util.spec_from_file_location("old_step", sys.argv[4] if len(sys.argv) > 4 else "/tmp/old_step.py")
old = importlib.util.module_from_spec(spec)
sys.modules["old_step"] = old
spec.loader.exec_module(old)
old.StepOutput = step_mod.StepOutput  # the rounds loop stacks outputs of its own type

target, draft, tok = models.builtin()
prompts = [p[:64] for p in builtin_prompts(4, 0, tok)[0]]
floor = make_floor(target, 64)


def engine():
    e = SpecEngine(target, draft if METHOD != "none" else None, SpecConfig(method=METHOD), max_batch_size=1,
                   max_seq_len=S, tokenizer=tok, batch_buckets=[1])
    e.warmup()  # compiles every program now, with the spec_step in place
    return e


new_fn, step_mod.spec_step = step_mod.spec_step, old.spec_step
a = engine()
step_mod.spec_step = new_fn
b = engine()
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"floor": lambda p: floor([p], 128)[0], "old": lambda p: a.generate([p], sp)[0].token_ids,
                "new": lambda p: b.generate([p], sp)[0].token_ids}, prompts, REPS)
print(f"S={S} method={METHOD} medians ms", medians_ms(t))
print("old speed / floor", speed(t["floor"], t["old"]))
print("new speed / floor", speed(t["floor"], t["new"]))
print("new speed / old", speed(t["old"], t["new"]))
