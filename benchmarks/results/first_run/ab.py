"""A K's first run costs extra on XLA:CPU: does `warmup(run=True)` move it to warmup?

Two engines on the built-in pair (K <= 6, buckets 1 and 2), one warmed with compilation
only, one also running rows through every (K, bucket) step (`SpecEngine._run_every_step`).
Each then generates the same two prompts at K = 5, 2, 6 (a fixed-K controller), each K
twice: the first call's
slowest step (after the one following the prefill) against the second's, and both calls'
wall times.

    python benchmarks/results/first_run/ab.py > benchmarks/results/first_run/ab.log
"""

import time

import dsd_jax as dsd
from dsd_jax.models import builtin, heldout_prompts


class Fixed:
    """A controller that always chooses `k`."""

    def __init__(self, k):
        self.k = k

    def choose_k(self, batch_size, context_len=None, request_ids=None, **kw):
        return self.k if batch_size else 0

    def observe(self, *a, **kw):
        pass


def main():
    target, draft, tok = builtin()
    prompts = heldout_prompts(2)
    sp = dsd.SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    engines = {}
    for run in (False, True):
        e = dsd.SpecEngine(target, draft, dsd.SpecConfig(method="draft_model", num_speculative_tokens=6),
                           max_batch_size=2, max_seq_len=448, batch_buckets=[1, 2], tokenizer=tok)
        t = time.perf_counter()
        n = e.warmup(run=run)
        print(f"warmup(run={run}): {n} programs in {time.perf_counter() - t:.1f} s", flush=True)
        engines[run] = e
    for e in engines.values():  # admission and prefill run on every call: take their first run out
        e.controller = Fixed(0)
        e.generate(prompts, sp)
    for k in (5, 2, 6):
        for run, e in engines.items():
            e.controller = Fixed(k)
            line = []
            for call in ("first", "second"):
                e.stats.reset()
                t = time.perf_counter()
                e.generate(prompts, sp)
                wall = (time.perf_counter() - t) * 1e3
                steps = [s["wall_ms"] for s in e.stats.trace if not s["after_prefill"]]
                line.append(f"{call} call {wall:.0f} ms (slowest step {max(steps):.1f} ms)")
            print(f"K={k} run={run}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
