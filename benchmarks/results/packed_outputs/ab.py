"""Paired B=1 greedy: a dispatch's outputs read back as one packed array (new) against seven
arrays (old, rebuilt here: the step program returns them unpacked and the host packs them
in numpy, ~20 us, before the engine's own processing).

    PYTHONPATH=../greedy_shortcut python ab.py REPS none|dynamic
"""
import sys

import jax
import numpy as np
from paired import interleave, medians_ms, speed

from dsd_jax import engine as engine_lib, models, step as step_lib
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.profile import Profile
from dsd_jax.programs import Programs
from dsd_jax.sampling import SamplingParams

REPS, METHOD = int(sys.argv[1]), sys.argv[2]
PROFILE = "../bench_full_s10.profile.json"
target, draft, tok = models.builtin()
prompts = [p[:64] for p in builtin_prompts(4, 0, tok)[0]]


class SevenOutputs(Programs):
    def _rounds(self, k, b, target_params, draft_params, state, num_rounds):
        new, outs, ran = step_lib.spec_rounds(self._graph, self._drafter, self.opts, k, b,
                                              target_params, draft_params, state, num_rounds)
        return new, (outs, ran)


def pack_host(outs, ran):  # `step.pack_rounds`' layout, without top logprobs (N = 0)
    per_row = np.stack([outs.n_emit, outs.n_accepted, outs.done.astype(np.int32),
                        np.broadcast_to(np.int32(ran), outs.n_emit.shape), np.zeros_like(outs.n_emit)],
                       axis=-1)
    return np.concatenate([outs.tokens, outs.logprobs.view(np.int32), outs.raw_logprobs.view(np.int32),
                           per_row], axis=-1)


class Old(SpecEngine):
    def _process(self, d):
        outs, ran = d.out
        host = jax.device_get((outs.tokens, outs.n_emit, outs.n_accepted, outs.done, outs.logprobs,
                               outs.raw_logprobs, ran))
        empty = np.zeros(host[0].shape + (0,), np.int32)  # no top logprobs
        return super()._process(d._replace(out=pack_host(step_lib.StepOutput(*host[:6], empty, empty), host[6])))


def engine(cls, programs):
    engine_lib.Programs = programs
    if METHOD == "none":
        spec, dr, prof = SpecConfig(method="none"), None, None
    else:
        spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic={"profile": None})
        dr, prof = draft, Profile.load(PROFILE)
    e = cls(target, dr, spec, max_batch_size=1, max_seq_len=256, tokenizer=tok, batch_buckets=[1],
            profile=prof)
    e.warmup()
    engine_lib.Programs = Programs
    return e


old, new = engine(Old, SevenOutputs), engine(SpecEngine, Programs)
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({"old": lambda p: old.generate([p], sp)[0].token_ids,
                "new": lambda p: new.generate([p], sp)[0].token_ids}, prompts, REPS)
print(METHOD, f"B=1 128 tokens, {len(t['old'])} paired calls; medians ms", medians_ms(t))
print("new speed / old", speed(t["old"], t["new"]))
