"""Episodes streaming through a fixed concurrency, as Tunix's agentic learner runs them:
what kept slots save when finished episodes' records compete with live ones.

24 episodes, at most 8 in flight (a semaphore: Tunix's `max_concurrency`), each in its own
thread with 2-5 turns (random per episode); a new episode starts as one ends, with a
256-token first prompt of its own. A turn is one `ThreadedEngine.generate` of the
episode's one prompt (greedy, max_tokens 32, ignore_eos), then an environment step (a sleep
of 0-4 ms), and the next turn's prompt is the prompt, its completion and 16 new tokens. The
built-in pair at K = 2 in an engine of 8 slots. Variants: "whole" (`share_prefixes=False`)
and "kept" (the default). Each round starts cold (`reset_prefix_cache`). "reusable" is what
every later turn could have taken from its episode's last slot (the last prompt and
completion, but the last position); tokens compared episode by episode. Usage:
python stream_ab.py [repeats]"""
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
EPISODES, CONCURRENCY, FIRST, REPLY, OUT = 24, 8, 256, 16, 32
target, draft, _ = builtin()
engines = {name: dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=CONCURRENCY,
                                max_seq_len=1024, share_prefixes=name != "whole")
           for name in ("whole", "kept")}
for eng in engines.values():
    eng.warmup()
fronts = {name: ThreadedEngine(eng) for name, eng in engines.items()}
rng = np.random.default_rng(0)
firsts = [rng.integers(10, 4000, FIRST).tolist() for _ in range(EPISODES)]
turns = rng.integers(2, 6, EPISODES).tolist()
replies = rng.integers(10, 4000, (max(turns), EPISODES, REPLY)).tolist()
params = dsd.SamplingParams(temperature=0.0, max_tokens=OUT, ignore_eos=True)


def rollout(name, seed):
    """Seconds for every episode, their tokens, the engine's metrics."""
    engine, front = engines[name], fronts[name]
    engine.reset_prefix_cache()
    engine.reset_metrics()
    tokens = [[] for _ in range(EPISODES)]
    waits = np.random.default_rng(seed).uniform(0, 0.004, (EPISODES, max(turns)))
    slots = threading.Semaphore(CONCURRENCY)

    def episode(i):
        with slots:
            prompt = list(firsts[i])
            for turn in range(turns[i]):
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
# a later turn's prompt begins with its last turn's prompt and completion; the slot holds
# all of them but the last position
reusable = sum(FIRST + t * (OUT + REPLY) - REPLY - 1 for i in range(EPISODES) for t in range(1, turns[i]))
prompt_tokens = sum(FIRST + t * (OUT + REPLY) for i in range(EPISODES) for t in range(turns[i]))
times = {v: [] for v in engines}
shared = []
order = list(engines)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        seconds, _, m = rollout(v, r + 1)
        times[v].append(seconds)
        if v == "kept":
            shared.append(m["shared_prefix_tokens"])
print(f"{REPEATS} pairs; {EPISODES} episodes of 2-5 turns ({sum(turns)} turns), at most {CONCURRENCY} in flight, "
      f"each in a thread: a {FIRST}-token first prompt, then prompt + {OUT} generated + {REPLY} new tokens each "
      f"turn, 0-4 ms between turns, greedy, built-in pair, K = 2, {CONCURRENCY} slots; ratio: "
      f"dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
print(f"same tokens: {first['whole'][1] == first['kept'][1]}; prompt tokens a rollout {prompt_tokens}, "
      f"reusable from the episodes' last slots {reusable}")
print(f"prefill tokens of the first rollout: whole {first['whole'][2]['prefill_tokens']}, "
      f"kept {first['kept'][2]['prefill_tokens']}")
print(f"kept: shared positions a rollout, median {int(np.median(shared))} ({np.median(shared) / reusable:.1%} "
      f"of the reusable), range {min(shared)}-{max(shared)}")
print(", ".join(f"{v} {1e3 * np.median(times[v]):.1f} ms" for v in engines))
print(f"kept/whole {format_ratio(paired_ratio(times['kept'], times['whole']), digits=3)}")
