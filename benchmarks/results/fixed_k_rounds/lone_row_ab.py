"""Paired B=1 dynamic (goodput controller, the s10 profile): a lone row's dispatch may run
past its length limit (new: the dispatch ends with the row) against the room rule (old).

    PYTHONPATH=../greedy_shortcut python lone_row_ab.py REPS

Ran at 3ee0ebe, where every controller's lone row ran on; `SpecEngine._rounds` has since
taken the batch and context too, and only a settled choice's lone row runs on.
"""
import collections
import sys

from paired import interleave, medians_ms, speed

from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.profile import Profile
from dsd_jax.sampling import SamplingParams

target, draft, tok = models.builtin()
prompts = builtin_prompts(8, 0, tok)[0]
profile = Profile.load("../bench_full_s10.profile.json")
rounds = collections.defaultdict(list)


class Logged(SpecEngine):
    name = "new"

    def _rounds(self, live, k, queued, inflight):
        r = super()._rounds(live, k, queued, inflight)
        rounds[self.name].append(r)
        return r


class Old(Logged):
    name = "old"

    def _rounds(self, live, k, queued, inflight):
        return super()._rounds(live + live, k, queued, inflight)  # two rows: the room rule applies


def engine(cls):
    spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic={"profile": None})
    e = cls(target, draft, spec, max_batch_size=1, max_seq_len=448, tokenizer=tok, batch_buckets=[1],
            profile=profile)
    e.warmup()
    return e


old, new = engine(Old), engine(Logged)
sp = SamplingParams(temperature=0.0, max_tokens=64)
t = interleave({"old": lambda p: old.generate([p], sp)[0].token_ids,
                "new": lambda p: new.generate([p], sp)[0].token_ids}, prompts, int(sys.argv[1]))
print(f"B=1 dynamic, 64 tokens, {len(t['old'])} paired calls; medians ms", medians_ms(t))
print("dispatches per call", {k: round(len(v) / len(t[k]), 1) for k, v in rounds.items()})
print("new speed / old", speed(t["old"], t["new"]))
