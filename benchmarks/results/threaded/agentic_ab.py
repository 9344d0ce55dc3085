"""Agentic episodes, a thread each, several turns: what kept slots save when calls overlap.

8 episodes, each in its own thread (as Tunix's agentic learner runs them), each a
256-token first prompt of its own and 4 turns; a turn is one `ThreadedEngine.generate` of
the episode's one prompt (greedy, max_tokens 32, ignore_eos), then an environment step (a
sleep of 0-4 ms, random per turn), and the next turn's prompt is the prompt, its completion
and 16 new tokens. The built-in pair at K = 2 in an engine of 8 slots. Variants: "whole"
(`share_prefixes=False`) and "kept" (the default: a turn's prompt takes prompt and
completion from the slot its episode's last request finished in, when no other admission
has taken it since, its record moved out of the way of other admissions:
`prefix_sharing.preserve`), and "copied", kept slots as they were before `preserve` (a
taker copied from a kept slot beyond the filled ones over whatever record it sat on; the
engine's `_preserve_kept` switched off on that instance). Each round starts cold (`reset_prefix_cache`). Tokens compared
episode by episode. Usage: python agentic_ab.py [repeats]"""
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
EPISODES, TURNS, FIRST, REPLY, OUT = 8, 4, 256, 16, 32
target, draft, _ = builtin()
engines = {name: dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=EPISODES,
                                max_seq_len=1024, share_prefixes=name != "whole")
           for name in ("whole", "copied", "kept")}
engines["copied"]._preserve_kept = lambda *args: None  # the behaviour before it
for eng in engines.values():
    eng.warmup()
fronts = {name: ThreadedEngine(eng) for name, eng in engines.items()}
rng = np.random.default_rng(0)
firsts = [rng.integers(10, 4000, FIRST).tolist() for _ in range(EPISODES)]
replies = rng.integers(10, 4000, (TURNS, EPISODES, REPLY)).tolist()
params = dsd.SamplingParams(temperature=0.0, max_tokens=OUT, ignore_eos=True)


def rollout(name, seed):
    """Seconds for every episode's turns, their tokens, the engine's metrics."""
    engine, front = engines[name], fronts[name]
    engine.reset_prefix_cache()
    engine.reset_metrics()
    tokens = [[] for _ in range(EPISODES)]
    waits = np.random.default_rng(seed).uniform(0, 0.004, (EPISODES, TURNS))

    def episode(i):
        prompt = list(firsts[i])
        for turn in range(TURNS):
            out = front.generate([prompt], params)[0].token_ids
            tokens[i].append(out)
            time.sleep(waits[i, turn])  # the environment's step
            prompt = prompt + list(out) + replies[turn][i]
    threads = [threading.Thread(target=episode, args=(i,)) for i in range(EPISODES)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    front.join()
    return seconds, tokens, engine.metrics()


first = {v: rollout(v, 0) for v in engines}
times = {v: [] for v in engines}
shared = {v: [] for v in engines}
order = list(engines)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        seconds, _, m = rollout(v, r + 1)
        times[v].append(seconds)
        shared[v].append(m["shared_prefix_tokens"])
print(f"{REPEATS} pairs; {EPISODES} episodes in threads x {TURNS} turns: a {FIRST}-token first prompt, then "
      f"prompt + {OUT} generated + {REPLY} new tokens each turn, 0-4 ms between turns, greedy, built-in pair, "
      f"K = 2, {EPISODES} slots; ratio: dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
same = all(first[v][1] == first["whole"][1] for v in engines)
print(f"same tokens: {same}; prefill tokens of the first rollout: "
      + ", ".join(f"{v} {first[v][2]['prefill_tokens']}" for v in engines))
for v in ("copied", "kept"):
    print(f"{v}: shared positions a rollout, median {int(np.median(shared[v]))}, "
          f"range {min(shared[v])}-{max(shared[v])}")
print(", ".join(f"{v} {1e3 * np.median(times[v]):.1f} ms" for v in engines))
for a, b in (("kept", "whole"), ("copied", "whole"), ("kept", "copied")):
    print(f"{a}/{b} {format_ratio(paired_ratio(times[a], times[b]), digits=3)}")
