"""Draft-model engine with the draft prefilled at admission (eager, before) vs caught up by
the first K>0 round (lazy, after), and vanilla; dynamic controller on the s8 profile."""
import time, statistics, sys
import numpy as np
from dsd_jax import models
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.config import SpecConfig, DynamicConfig
from dsd_jax.controller import Controller
from dsd_jax.drafters.draft_model import DraftModel
from dsd_jax.engine import SpecEngine
from dsd_jax.profile import Profile
from dsd_jax.sampling import SamplingParams

PROF = "benchmarks/results/bench_full_s8.profile.json"
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
target, draft, tok = models.builtin()
prompts, _ = builtin_prompts(64, 0, tok)
prompts = [p[:128] for p in prompts]
buckets = [1, 32, 64]
common = dict(max_batch_size=64, max_seq_len=448, tokenizer=tok, batch_buckets=buckets,
              compilation_cache_dir="/tmp/jaxcache")
spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(profile=PROF))
engines = {"vanilla": SpecEngine(target, None, SpecConfig(method="none"), **common)}
engines["vanilla"].warmup()
engines["eager"] = SpecEngine(target, draft, spec, **common)
object.__setattr__(engines["eager"].drafter, "catches_up_prompts", False)  # before: always prefilled
engines["eager"].warmup()
engines["lazy"] = SpecEngine(target, draft, spec, **common); engines["lazy"].warmup()
assert engines["lazy"].drafter.catches_up_prompts and not engines["eager"].drafter.catches_up_prompts
prof = Profile.load(PROF)
for name in ("eager", "lazy"):
    engines[name].controller = Controller(spec, prof, 64, batch_buckets=buckets)
sp = SamplingParams(temperature=0.0, max_tokens=64)
points = {1: [prompts[i:i + 1] for i in range(8)], 32: [prompts[:32]], 64: [prompts[:64]]}
res = {(b, n): [] for b in points for n in engines}
ref = {}
for b, groups in points.items():  # untimed once
    for g in groups:
        for n, e in engines.items():
            out = [o.token_ids for o in e.generate(g, sp)]
            ref.setdefault((b, id(g)), out)
            assert out == ref[(b, id(g))], (b, n)
names = list(engines)
for rep in range(REPS):
    for b, groups in points.items():
        for gi, g in enumerate(groups):
            r = (rep + gi) % 3
            for n in names[r:] + names[:r]:
                t0 = time.perf_counter(); outs = engines[n].generate(g, sp); dt = time.perf_counter() - t0
                assert [o.token_ids for o in outs] == ref[(b, id(g))]
                res[(b, n)].append(sum(len(o.token_ids) for o in outs) / dt)
def boot(x, y):
    r = np.array(x) / np.array(y); rng = np.random.default_rng(0)
    m = [np.median(r[rng.integers(0, len(r), len(r))]) for _ in range(4000)]
    return f"{np.median(r):.3f} [{np.percentile(m, 2.5):.3f}, {np.percentile(m, 97.5):.3f}] n={len(r)}"
for b in points:
    print(f"B={b}: tok/s " + ", ".join(f"{n} {statistics.median(res[(b, n)]):.0f}" for n in names))
    print(f"   lazy/eager {boot(res[(b, 'lazy')], res[(b, 'eager')])}; eager/vanilla {boot(res[(b, 'eager')], res[(b, 'vanilla')])}; lazy/vanilla {boot(res[(b, 'lazy')], res[(b, 'vanilla')])}")
for n in ("eager", "lazy"):
    print(n, "controller k_steps", engines[n].controller.stats()["k_steps"], "probes", engines[n].controller.stats()["probes"])
