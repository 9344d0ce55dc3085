"""What the per-round host work costs at B=1 (S=4096, 128 tokens), one process, paired:

    python host_ub.py REPS

base: the engine; noop: its stats.record_step and controller.observe as no-ops; bare: a
minimal `_process` (B=1, K=0: tokens and logprobs out, nothing else). An upper bound on
what making the host loop cheaper could buy."""
import sys, types
sys.path.insert(0, '.')
import numpy as np, jax
from paired import interleave, plain_engine, report
from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.engine import SpecEngine
from dsd_jax.sampling import SamplingParams
from dsd_jax.step import unpack_rounds
REPS = int(sys.argv[1])
target, draft, tok = models.builtin()
prompts = [p[:64] for p in builtin_prompts(4, 0, tok)[0]]
base = plain_engine(SpecEngine, target, tok, 4096)
noop = plain_engine(SpecEngine, target, tok, 4096)
noop.stats.record_step = lambda *a, **k: 0.0
noop.controller.observe = lambda *a, **k: None
bare = plain_engine(SpecEngine, target, tok, 4096)
def process(self, d):  # B=1, K=0 only: tokens out, nothing else
    (tokens, n_emit, n_acc, done, lp, raw, *_), R = unpack_rounds(jax.device_get(d.out))
    r = d.snapshot[0]
    if r is None or r.finish_reason is not None:
        return [], []
    m = n_emit[:, 0] > 0
    new = tokens[:, 0, 0][m].tolist()
    r.tokens += new
    r.logprobs += lp[:, 0, 0][m].tolist(); r.raw_logprobs += raw[:, 0, 0][m].tolist()
    if done[:, 0].any():
        r.finish_reason = "length"; return [(r, new)], [r]
    return [(r, new)], []
bare._process = types.MethodType(process, bare)
sp = SamplingParams(temperature=0.0, max_tokens=128)
t = interleave({n: (lambda e: lambda p: e.generate([p], sp)[0].token_ids)(e) for n, e in
                {"base": base, "noop": noop, "bare": bare}.items()}, prompts, REPS)
report(t, "B=1 S=4096 128 tokens", [("no stats/observe / base", "noop", "base"), ("bare process / base", "bare", "base")])
