"""What sharing one running batch between threads gives callers that arrive together.

Tunix's agentic learner calls its rollout from a thread per episode, one conversation a
call. A round: 8 calls of one prompt each (64 random tokens), greedy, max_tokens 32
(ignore_eos), on the built-in pair (K = 2) in an engine of 8 slots. Variants, in random
order within each repeat, paired:
- "threads": 8 threads call `ThreadedEngine.generate` at once; the round ends when the last
  returns (their requests join one run: `dsd_jax/threaded.py`), the run starting
  `threaded.GATHER_S` after the first call;
- "ungathered": the same with `gather_s=0`, the run starting with the first call (the
  others join at its next admission);
- "serial": the 8 calls one after another, what callers sharing an engine behind a lock get;
- "batched": one `generate` of the 8 prompts, the floor (everything admitted at once).
Each variant's tokens are compared with the others'. Usage: python ab.py [repeats]"""
import random
import sys
import threading
import time

import numpy as np

import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax.stats import format_ratio, paired_ratio
from dsd_jax.threaded import ThreadedEngine

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
CALLS, PROMPT, TOKENS = 8, 64, 32
target, draft, _ = builtin()
engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=CALLS,
                        max_seq_len=256)
engine.warmup()
fronts = {"threads": ThreadedEngine(engine), "ungathered": ThreadedEngine(engine, gather_s=0.0)}
rng = np.random.default_rng(0)
prompts = [rng.integers(10, 4000, PROMPT).tolist() for _ in range(CALLS)]
params = dsd.SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)


def threads(front):
    out = [None] * CALLS

    def one(i):
        out[i] = front.generate([prompts[i]], params)[0]
    ts = [threading.Thread(target=one, args=(i,)) for i in range(CALLS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    front.join()
    return out


variants = {"threads": lambda: threads(fronts["threads"]), "ungathered": lambda: threads(fronts["ungathered"]),
            "serial": lambda: [engine.generate([p], params)[0] for p in prompts],
            "batched": lambda: engine.generate(prompts, params)}


def timed(name):
    engine.reset_prefix_cache()  # nothing kept from the last round
    t0 = time.perf_counter()
    out = variants[name]()
    return time.perf_counter() - t0, [o.token_ids for o in out]


tokens = {v: timed(v)[1] for v in variants}
same = all(t == tokens["batched"] for t in tokens.values())
times = {v: [] for v in variants}
order = list(variants)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        times[v].append(timed(v)[0])
print(f"{REPEATS} pairs; {CALLS} calls of one {PROMPT}-token prompt, greedy, {TOKENS} tokens, built-in pair, "
      f"K = 2, {CALLS} slots; same tokens in every variant: {same}")
for v in variants:
    print(f"{v}: {1e3 * np.median(times[v]):.1f} ms a round")
print(f"threads/serial {format_ratio(paired_ratio(times['threads'], times['serial']), digits=3)}")
print(f"threads/batched {format_ratio(paired_ratio(times['threads'], times['batched']), digits=3)}")
print(f"ungathered/batched {format_ratio(paired_ratio(times['ungathered'], times['batched']), digits=3)}")
print(f"threads/ungathered {format_ratio(paired_ratio(times['threads'], times['ungathered']), digits=3)}")
