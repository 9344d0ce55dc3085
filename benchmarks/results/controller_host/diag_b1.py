"""B=1 (or B=2: argv[2]): static-4, dynamic capped at K=4 and dynamic, paired; each one's
dispatches (rounds a dispatch) and round times by K.

    python benchmarks/results/controller_host/diag_b1.py UNITS [B]
"""
import collections, sys, time, statistics
import numpy as np
sys.path.insert(0, "benchmarks/results/controller_host")
import engine_ab as E
from dsd_jax import SamplingParams, SpecConfig, SpecEngine
from dsd_jax.config import DynamicConfig
from dsd_jax.models import builtin, heldout_prompts
from dsd_jax.profile import Profile

units = int(sys.argv[1])
B = int(sys.argv[2]) if len(sys.argv) > 2 else 1
buckets = [1, 2, 4]
ctls = E.controllers("ks", None, buckets)
ctls = {n: ctls[n] for n in ("static-4", "dynamic-max4", "dynamic")}
target, draft, tok = builtin()
spec = SpecConfig(method="draft_model", num_speculative_tokens=6, dynamic=DynamicConfig(objective="makespan"))
engine = SpecEngine(target, draft, spec, max_batch_size=4, max_seq_len=448, batch_buckets=buckets,
                    controller=ctls["static-4"], profile=Profile.load(E.PROFILE))
engine.warmup()
ids = [tok.encode(p).ids[:128] for p in heldout_prompts(615)]
sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
pol = engine._policy
orig_rounds = pol.rounds
log = []
def rounds(*a, **kw):
    r = orig_rounds(*a, **kw); log.append((a[1], r)); return r
pol.rounds = rounds
names = list(ctls)
walls = collections.defaultdict(list); disp = collections.defaultdict(list); traces = collections.defaultdict(list)
for u in range(units):
    for name in names[u % 3:] + names[:u % 3]:
        engine.controller = ctls[name]; engine.stats.reset(); engine.reset_prefix_cache(); log.clear()
        t0 = time.perf_counter(); engine.generate(ids[u * B:(u + 1) * B], sampling); walls[name].append(time.perf_counter() - t0)
        disp[name].append(list(log)); traces[name].append(list(engine.stats.trace))
for name in names:
    w = np.array(walls[name]) * 1e3
    nd = [len(d) for d in disp[name]]
    lens = collections.Counter(r for d in disp[name] for _, r in d)
    rt = collections.defaultdict(list)
    first = []
    for tr in traces[name]:
        first.append(tr[0]["wall_ms"])
        for s in tr[1:]:
            rt[s["k"]].append(s["wall_ms"])
    dec = [sum(s["wall_ms"] for s in tr[1:]) for tr in traces[name]]
    print(f"{name}: wall median {np.median(w):.1f} ms; first round (with prefill) {np.median(first):.1f}; decode {np.median(dec):.1f}; "
          f"untraced {np.median(w - np.array([sum(s['wall_ms'] for s in tr) for tr in traces[name]])):.1f}; dispatches/call {np.mean(nd):.1f}; rounds/call {np.mean([len(t) for t in traces[name]]):.1f}")
    print("   dispatch lengths:", dict(sorted(lens.items())))
    print("   round ms by K (median, n):", {k: (round(statistics.median(v), 2), len(v)) for k, v in sorted(rt.items())})
    print("   K sequence of call 0..2:", [[s["k"] for s in tr] for tr in traces[name][:3]])
for a in ("dynamic-max4", "dynamic"):
    r = E.paired_ratio(walls["static-4"], walls[a]); print(f"{a} / static-4: {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
