"""Dynamic K on an engine not warmed up (the quick-start notebook's way): what the controller
learns when the runs' first uses of programs compile inside them.

    python benchmarks/results/lazy_compile/lazy_dynamic.py PROFILE.json [rounds]

Built-in pair, draft_model K 0..3, buckets 1, 4, 16, the demo's profile (`dsd-jax demo` writes
dsd_jax_demo/profile.json). One engine, no warmup(); `rounds` (default 3) generates of 16
held-out prompts, greedy, prompt i asking for 4 + 4 i tokens (the batch shrinks
through every bucket, each first reached inside the run). After each: the K histogram, the controller's
learnt latency factors and probe excess per batch bucket, and `metrics()`' compile_s and
tokens_per_s. Run it on two checkouts (PYTHONPATH) to compare."""
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import dsd_jax as dsd  # noqa: E402
from dsd_jax import models  # noqa: E402

target, draft, tok = models.builtin()
spec = dsd.SpecConfig(method="draft_model", num_speculative_tokens=3, dynamic=dsd.DynamicConfig(profile=sys.argv[1]))
engine = dsd.SpecEngine(target, draft, spec, max_batch_size=16, batch_buckets=(1, 4, 16), max_seq_len=160,
                        prefill_chunk=32, tokenizer=tok)
prompts = models.heldout_prompts(16, seed=3)
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    engine.reset_metrics()
    t0 = time.perf_counter()
    engine.generate(prompts, [dsd.SamplingParams(temperature=0.0, max_tokens=4 + 4 * i, ignore_eos=True)
                              for i in range(len(prompts))])
    m, c = engine.metrics(), engine.metrics()["controller"]
    print(f"generate {r}: {time.perf_counter() - t0:.1f} s, k_hist {m['k_hist']}, compile_s {m.get('compile_s')}, "
          f"tokens_per_s {m['tokens_per_s']:.1f}", flush=True)
    print(f"  latency_factors {c['latency_factors']}", flush=True)
    print(f"  probe_excess {c['probe_excess']}, probes {c.get('probes')}, k_choices {c.get('k_choices')}", flush=True)
