"""Agentic episodes, a thread each, several turns: what kept slots save when calls overlap.

8 episodes, each in its own thread (as Tunix's agentic learner runs them), each a
256-token first prompt of its own and 4 turns; a turn is one `ThreadedEngine.generate` of
the episode's one prompt (greedy, max_tokens 32, ignore_eos), then an environment step (a
sleep of 0-4 ms, random per turn), and the next turn's prompt is the prompt, its completion
and 16 new tokens. The built-in pair at K = 2 in an engine of 8 slots. Variants: "whole"
(`share_prefixes=False`) and "kept" (the default: a turn's prompt takes prompt and
completion from the slot its episode's last request finished in, when no other admission
has taken it since). Each round starts cold (`reset_prefix_cache`). Tokens compared
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
                                max_seq_len=1024, share_prefixes=name == "kept")
           for name in ("whole", "kept")}
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


(_, whole_tokens, whole_m), (_, kept_tokens, kept_m) = rollout("whole", 0), rollout("kept", 0)
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
print(f"{REPEATS} pairs; {EPISODES} episodes in threads x {TURNS} turns: a {FIRST}-token first prompt, then "
      f"prompt + {OUT} generated + {REPLY} new tokens each turn, 0-4 ms between turns, greedy, built-in pair, "
      f"K = 2, {EPISODES} slots; ratio: dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
print(f"same tokens: {whole_tokens == kept_tokens}; prefill tokens a rollout: whole {whole_m['prefill_tokens']}, "
      f"kept {kept_m['prefill_tokens']}; shared positions per kept rollout: median {int(np.median(shared))}, "
      f"range {min(shared)}-{max(shared)}")
print(f"whole {1e3 * np.median(times['whole']):.1f} ms, kept {1e3 * np.median(times['kept']):.1f} ms, "
      f"kept/whole {format_ratio(paired_ratio(times['kept'], times['whole']), digits=3)}")
